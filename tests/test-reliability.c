/* Reliability through the command line: what happens to the user's data when DST is
 * odd, when input is hostile, when the run is interrupted; every refusal one line.
 * (Issue 10; the trust rules of plugins and conf.d are in test-context too.) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-glib/json-glib.h>

#include <wsync/wsync.h>

#include "testutil.h"

typedef TestRun Run;
#define assert_has test_assert_has
#define run_clear test_run_clear

typedef struct {
  char *dir;  /* scratch */
  char *conf; /* conf.d selecting qwen3_moe and vllm */
  char *tiny; /* a synthesised tiny Qwen3-MoE checkpoint */
} Fixture;

/* wsync with the fixture's conf.d and both plugin directories, then @args. */
static Run
run_args(Fixture *f, GPtrArray *args)
{
  g_ptr_array_add(args, "--conf-dir");
  g_ptr_array_add(args, f->conf);
  g_ptr_array_add(args, "--plugin-dir");
  g_ptr_array_add(args, (gpointer)test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"));
  g_ptr_array_add(args, "--plugin-dir");
  g_ptr_array_add(args, (gpointer)test_env_dir("WSYNC_TEST_PLUGIN_DIR"));
  return test_run_args(args);
}

static Run
run_wsync(Fixture *f, const char *first, ...)
{
  g_autoptr(GPtrArray) args = g_ptr_array_new();
  va_list ap;

  va_start(ap, first);
  for (const char *a = first; a != NULL; a = va_arg(ap, const char *))
    g_ptr_array_add(args, (gpointer)a);
  va_end(ap);
  return run_args(f, args);
}

static char *
tiny_config(void)
{
  return g_test_build_filename(G_TEST_DIST, "..", "configs", "tiny-qwen3-moe.json", NULL);
}

static void
fixture_setup(Fixture *f, gconstpointer data)
{
  (void)data;
  f->dir = test_tmpdir();
  f->conf = g_build_filename(f->dir, "conf.d", NULL);
  g_mkdir(f->conf, 0700);
  g_free(test_write(f->conf, "10.conf", "plugin \"qwen3_moe\" {}\nplugin \"vllm\" {}\n"));
  f->tiny = g_build_filename(f->dir, "tiny", NULL);
  g_autofree char *config = tiny_config();
  Run r = run_wsync(f, "synth", "--config", config, f->tiny, "--pattern", "index", "-q", NULL);
  if (r.status != 0)
    g_error("synth failed: %s", r.err);
  run_clear(&r);
}

static void
fixture_teardown(Fixture *f, gconstpointer data)
{
  (void)data;
  test_rmtree(f->dir);
  g_free(f->dir);
  g_free(f->conf);
  g_free(f->tiny);
}

static char *
path_in(Fixture *f, const char *name)
{
  return g_build_filename(f->dir, name, NULL);
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The names in @dir, sorted, joined by spaces (dotfiles included). */
static char *
names_in(const char *dir)
{
  g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  const char *name;

  if (d == NULL)
    return g_strdup("(no directory)");
  while ((name = g_dir_read_name(d)) != NULL)
    g_ptr_array_add(names, g_strdup(name));
  g_ptr_array_sort(names, compare_names);
  g_ptr_array_add(names, NULL);
  return g_strjoinv(" ", (char **)names->pdata);
}

static char *
read_text(const char *path)
{
  char *text = NULL;
  if (!g_file_get_contents(path, &text, NULL, NULL))
    return g_strdup("(unreadable)");
  return text;
}

/* Exactly one error line, "wsync: " + @message + "\n", and @status. */
static void
assert_refusal(Run *r, int status, const char *message)
{
  g_autofree char *expect = g_strdup_printf("wsync: %s\n", message);
  if (r->status != status || g_strcmp0(r->err, expect) != 0)
    g_error("expected exit %d and \"%s\", got exit %d and \"%s\"", status, expect, r->status,
            r->err);
}

/* A user's directory: one file with known contents. */
static char *
user_dir(Fixture *f, const char *name)
{
  char *dir = path_in(f, name);
  g_mkdir(dir, 0755);
  g_free(test_write(dir, "precious.txt", "the user's own file\n"));
  return dir;
}

static void
assert_user_dir_intact(const char *dir)
{
  g_autofree char *names = names_in(dir);
  g_assert_cmpstr(names, ==, "precious.txt");
  g_autofree char *file = g_build_filename(dir, "precious.txt", NULL);
  g_autofree char *text = read_text(file);
  g_assert_cmpstr(text, ==, "the user's own file\n");
}

/* No ".BASE.wsync-*" temporary is left in @dir. */
static void
assert_no_temporaries(const char *dir)
{
  g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
  const char *name;

  while (d != NULL && (name = g_dir_read_name(d)) != NULL)
    if (name[0] == '.' && strstr(name, ".wsync-") != NULL && strcmp(name, ".wsync-output") != 0)
      g_error("a temporary directory is left: %s/%s", dir, name);
}

#define VLLM_TP2_FILES                                                                         \
  ".wsync-output config.json model-rank-0-part-0.safetensors model-rank-1-part-0.safetensors"
#define HF_FILES                                                                               \
  ".wsync-output config.json model-00001-of-00001.safetensors model.safetensors.index.json"

/* ------------------------------------------------------------------ data loss: DST */

static void
test_dst_symlink_to_directory(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *victim = user_dir(f, "victim");
  g_autofree char *link = path_in(f, "link");
  g_assert_cmpint(symlink(victim, link), ==, 0);

  Run r = run_wsync(f, "convert", f->tiny, link, "--target", "vllm", "-q", NULL);
  g_autofree char *msg = g_strdup_printf(
      "%s: DST is a symlink; wsync neither writes through nor replaces one: give the directory "
      "itself",
      link);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  /* --force does not change that, nor does a trailing slash */
  g_autofree char *slashed = g_strconcat(link, "/", NULL);
  r = run_wsync(f, "convert", f->tiny, slashed, "--target", "vllm", "--force", "-q", NULL);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  assert_user_dir_intact(victim);
  g_assert_true(g_file_test(link, G_FILE_TEST_IS_SYMLINK));
  assert_no_temporaries(f->dir);
}

static void
test_dst_is_src(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *before = names_in(f->tiny);
  g_autofree char *slashed = g_strconcat(f->tiny, "/", NULL);
  g_autofree char *dotted = g_build_filename(f->dir, ".", "tiny", NULL);
  /* the same directory through a symlinked parent */
  g_autofree char *alias = path_in(f, "alias");
  g_assert_cmpint(symlink(f->dir, alias), ==, 0);
  g_autofree char *through = g_build_filename(alias, "tiny", NULL);
  const char *spellings[] = {f->tiny, slashed, dotted, through};

  for (guint i = 0; i < G_N_ELEMENTS(spellings); i++) {
    /* a runtime target drops nothing here, but would have replaced the source */
    Run r = run_wsync(f, "convert", f->tiny, spellings[i], "--target", "vllm", "--force", "-q",
                      NULL);
    g_autofree char *shown = g_strndup(spellings[i], strlen(spellings[i]) -
                                                         (g_str_has_suffix(spellings[i], "/")));
    g_autofree char *msg = g_strdup_printf(
        "%s: DST is the source %s; write the output elsewhere", shown, f->tiny);
    assert_refusal(&r, 2, msg);
    run_clear(&r);
  }
  g_autofree char *after = names_in(f->tiny);
  g_assert_cmpstr(after, ==, before);
  Run r = run_wsync(f, "verify", f->tiny, f->tiny, "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
}

static void
test_dst_contains_src(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *par = path_in(f, "par");
  g_autofree char *src = g_build_filename(par, "src", NULL);
  g_mkdir(par, 0755);
  g_free(test_write(par, "notes.txt", "not a checkpoint\n"));
  g_assert_cmpint(rename(f->tiny, src), ==, 0);

  Run r = run_wsync(f, "convert", src, par, "--target", "hf", "--force", "-q", NULL);
  g_autofree char *msg =
      g_strdup_printf("%s: DST contains the source %s; write the output elsewhere", par, src);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  /* a single-file source: its directory contains it */
  g_autofree char *file = g_build_filename(src, "model-00001-of-00001.safetensors", NULL);
  r = run_wsync(f, "convert", file, src, "--target", "hf", "--force", "-q", NULL);
  g_autofree char *msg2 =
      g_strdup_printf("%s: DST contains the source %s; write the output elsewhere", src, file);
  assert_refusal(&r, 2, msg2);
  run_clear(&r);
  g_autofree char *names = names_in(par);
  g_assert_cmpstr(names, ==, "notes.txt src");
  g_autofree char *src_names = names_in(src);
  g_assert_cmpstr(src_names, ==, HF_FILES);
}

static void
test_dst_inside_src(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *inside = g_build_filename(f->tiny, "sub", "out", NULL);
  Run r = run_wsync(f, "convert", f->tiny, inside, "--target", "vllm", "-q", NULL);
  g_autofree char *msg = g_strdup_printf(
      "%s: DST lies inside the source %s; write the output elsewhere", inside, f->tiny);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  g_autofree char *names = names_in(f->tiny);
  g_assert_cmpstr(names, ==, HF_FILES); /* not even the parent was created */
}

static void
test_dst_not_wsync_output(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *mine = user_dir(f, "mine");
  Run r = run_wsync(f, "convert", f->tiny, mine, "--target", "vllm", "--tp", "2", "-q", NULL);
  g_autofree char *msg = g_strdup_printf(
      "%s: DST exists and is not wsync's output (it has no .wsync-output file); move it away, "
      "or pass --force to replace it and everything in it",
      mine);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  assert_user_dir_intact(mine);
  /* synth and merge refuse it as well */
  g_autofree char *config = tiny_config();
  r = run_wsync(f, "synth", "--config", config, mine, "-q", NULL);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  assert_user_dir_intact(mine);
  assert_no_temporaries(f->dir);

  /* --force replaces it whole */
  r = run_wsync(f, "convert", f->tiny, mine, "--target", "vllm", "--tp", "2", "--force", "-q",
                NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);
  g_autofree char *names = names_in(mine);
  g_assert_cmpstr(names, ==, VLLM_TP2_FILES);
  assert_no_temporaries(f->dir);
}

static void
test_dst_own_output_replaced(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *out = path_in(f, "out");
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--tp", "2", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *names = names_in(out);
  g_assert_cmpstr(names, ==, VLLM_TP2_FILES);
  g_autofree char *marker = g_build_filename(out, ".wsync-output", NULL);
  g_autofree char *text = read_text(marker);
  g_assert_true(g_str_has_prefix(text, "This directory was written by wsync "));
  assert_has(text, "A later wsync run into it replaces it whole; without this file, wsync refuses "
                   "to.\n");

  /* wsync's own output is replaced without --force, whole */
  r = run_wsync(f, "convert", f->tiny, out, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *names2 = names_in(out);
  g_assert_cmpstr(names2, ==, HF_FILES);
  r = run_wsync(f, "verify", f->tiny, out, "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);

  /* so is an empty directory */
  g_autofree char *empty = path_in(f, "empty");
  g_mkdir(empty, 0755);
  r = run_wsync(f, "convert", f->tiny, empty, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *names3 = names_in(empty);
  g_assert_cmpstr(names3, ==, HF_FILES);
  assert_no_temporaries(f->dir);
}

/* Replacing a previous output never follows a symlink someone put inside it. */
static void
test_old_dst_symlinks_not_followed(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *out = path_in(f, "out");
  g_autofree char *victim = user_dir(f, "victim");
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *link = g_build_filename(out, "cache", NULL);
  g_assert_cmpint(symlink(victim, link), ==, 0);
  g_autofree char *sub = g_build_filename(out, "sub", NULL);
  g_mkdir(sub, 0755);
  g_autofree char *link2 = g_build_filename(sub, "deeper", NULL);
  g_assert_cmpint(symlink(victim, link2), ==, 0);

  r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--tp", "2", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *names = names_in(out);
  g_assert_cmpstr(names, ==, VLLM_TP2_FILES);
  assert_user_dir_intact(victim);
  assert_no_temporaries(f->dir);
}

static void
test_dst_trailing_slash(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *out = path_in(f, "out");
  g_autofree char *slashed = g_strconcat(out, "//", NULL);
  for (int i = 0; i < 2; i++) { /* new, then replacing its own output */
    Run r = run_wsync(f, "convert", f->tiny, slashed, "--target", "vllm", "--tp", "2", NULL);
    g_assert_cmpint(r.status, ==, 0);
    g_autofree char *expect = g_strdup_printf("wrote %s: ", slashed);
    g_assert_true(g_str_has_prefix(r.out, expect));
    run_clear(&r);
    g_autofree char *names = names_in(out);
    g_assert_cmpstr(names, ==, VLLM_TP2_FILES);
    assert_no_temporaries(out); /* the temporary was not made inside "out/" */
  }
  assert_no_temporaries(f->dir);
  Run r = run_wsync(f, "convert", f->tiny, "/", "--target", "vllm", "-q", NULL);
  assert_refusal(&r, 2, "/: DST must name the output directory itself (not /, . or ..)");
  run_clear(&r);
}

/* The output directory gets the mode the user's umask gives any new directory. */
static void
test_dst_mode_follows_umask(Fixture *f, gconstpointer data)
{
  (void)data;
  const mode_t masks[] = {022, 027, 077};
  for (guint i = 0; i < G_N_ELEMENTS(masks); i++) {
    g_autofree char *name = g_strdup_printf("out-%03o", masks[i]);
    g_autofree char *out = path_in(f, name);
    mode_t old = umask(masks[i]); /* inherited by the wsync started below */
    Run r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "-q", NULL);
    umask(old);
    g_assert_cmpint(r.status, ==, 0);
    run_clear(&r);
    struct stat st;
    g_assert_cmpint(stat(out, &st), ==, 0);
    g_assert_cmpint(st.st_mode & 07777, ==, 0777 & ~masks[i]);
    g_autofree char *rank = g_build_filename(out, "model-rank-0-part-0.safetensors", NULL);
    g_assert_cmpint(stat(rank, &st), ==, 0);
    g_assert_cmpint(st.st_mode & 0044, ==, 0644 & ~masks[i] & 0044);
  }
}

/* ------------------------------------------------------------------ crashes */

/* A config.json nesting 75000 arrays deep (json-glib recursed until the stack ran out). */
static char *
deep_config(Fixture *f, const char *dir_name, gsize *byte)
{
  g_autofree char *dir = path_in(f, dir_name);
  const char *prefix = "{\"model_type\": \"qwen3_moe\", \"deep\": ";
  GString *text = g_string_new(prefix);

  for (int i = 0; i < 75000; i++)
    g_string_append_c(text, '[');
  for (int i = 0; i < 75000; i++)
    g_string_append_c(text, ']');
  g_string_append(text, "}\n");
  *byte = strlen(prefix) + 63; /* the 65th level: the 64th bracket after the object's */
  g_mkdir(dir, 0755);
  char *config = test_write(dir, "config.json", text->str);
  g_string_free(text, TRUE);
  return config;
}

static void
test_deep_config_json(Fixture *f, gconstpointer data)
{
  (void)data;
  gsize byte;
  g_autofree char *config = deep_config(f, "deep", &byte);
  g_autofree char *msg =
      g_strdup_printf("%s: JSON nests deeper than 64 levels (at byte %zu)", config, byte);
  /* the same checkpoint with the deep config */
  g_autofree char *src = path_in(f, "deep");
  g_autofree char *weights = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *copy = g_build_filename(src, "model-00001-of-00001.safetensors", NULL);
  test_copy(weights, copy);
  g_autofree char *out = path_in(f, "out");

  Run r = run_wsync(f, "plan", src, "--target", "vllm", NULL);
  assert_refusal(&r, 3, msg);
  run_clear(&r);
  r = run_wsync(f, "convert", src, out, "--target", "vllm", NULL);
  assert_refusal(&r, 3, msg);
  run_clear(&r);
  r = run_wsync(f, "config", config, NULL);
  assert_refusal(&r, 3, msg);
  run_clear(&r);
  r = run_wsync(f, "synth", "--config", config, out, NULL);
  assert_refusal(&r, 3, msg);
  run_clear(&r);
  g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
}

/* A conf.d file nesting 50000 blocks (libconfuse 3.3 recursed until the stack ran out). */
static void
test_deep_conf_file(Fixture *f, gconstpointer data)
{
  (void)data;
  GString *text = g_string_new("# deep\n");
  for (int i = 0; i < 50000; i++)
    g_string_append(text, "x {");
  for (int i = 0; i < 50000; i++)
    g_string_append_c(text, '}');
  g_autofree char *conf = test_write(f->conf, "20-deep.conf", text->str);
  g_string_free(text, TRUE);

  Run r = run_wsync(f, "plugins", NULL);
  g_autofree char *msg = g_strdup_printf("%s:2: blocks nest deeper than 16 levels", conf);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  /* sixteen levels are for libconfuse to judge (this text is simply not wsync's syntax) */
  g_free(test_write(f->conf, "20-deep.conf", "sync {\n  target = \"vllm\"\n}\n"));
  r = run_wsync(f, "plugins", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
}

/* A source truncated while convert runs: an I/O error, not SIGBUS; the temporary is
 * removed and the previous DST stays. */
static void
test_source_shrinks_while_converting(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *out = path_in(f, "out");
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);

  g_autofree char *weights = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *conf = g_strdup_printf(
      "plugin \"saboteur\" {\n  truncate = \"%s\"\n}\n", weights);
  g_free(test_write(f->conf, "20-saboteur.conf", conf));
  r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--threads", "1", NULL);
  g_autofree char *prefix = g_strdup_printf(
      "wsync: cannot read %s: the file shrank while wsync was reading it (tensor \"", weights);
  if (r.status != 4 || !g_str_has_prefix(r.err, prefix) || !g_str_has_suffix(r.err, "\")\n") ||
      strchr(r.err, '\n') != r.err + strlen(r.err) - 1)
    g_error("exit %d, stderr \"%s\"", r.status, r.err);
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
  g_autofree char *names = names_in(out);
  g_assert_cmpstr(names, ==, HF_FILES);
  assert_no_temporaries(f->dir);
}

#define ADD(path, fn) g_test_add(path, Fixture, NULL, fixture_setup, fn, fixture_teardown)

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  ADD("/reliability/dst/symlink-to-directory", test_dst_symlink_to_directory);
  ADD("/reliability/dst/is-src", test_dst_is_src);
  ADD("/reliability/dst/contains-src", test_dst_contains_src);
  ADD("/reliability/dst/inside-src", test_dst_inside_src);
  ADD("/reliability/dst/not-wsync-output", test_dst_not_wsync_output);
  ADD("/reliability/dst/own-output-replaced", test_dst_own_output_replaced);
  ADD("/reliability/dst/old-symlinks-not-followed", test_old_dst_symlinks_not_followed);
  ADD("/reliability/dst/trailing-slash", test_dst_trailing_slash);
  ADD("/reliability/dst/mode-follows-umask", test_dst_mode_follows_umask);
  ADD("/reliability/crash/deep-config-json", test_deep_config_json);
  ADD("/reliability/crash/deep-conf-file", test_deep_conf_file);
  ADD("/reliability/crash/source-shrinks", test_source_shrinks_while_converting);
  return g_test_run();
}
