/* Reliability through the command line: what happens to the user's data when DST is
 * odd, when input is hostile, when the run is interrupted; every refusal one line.
 * (Issue 10; the trust rules of plugins and conf.d are in test-context too.) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <json-glib/json-glib.h>

#include <wsync/wsync.h>

#include "../core/files.h"
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
  g_free(test_write(f->conf, "10.conf", "plugin \"hf\" {}\nplugin \"qwen3_moe\" {}\nplugin \"vllm\" {}\n"));
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

/* A conf.d file whose last block is never closed (a forgotten '}'): libconfuse 3.3 takes
 * the end of the file for it and the run went on; it is a syntax error, named with the
 * line of the block left open, and nothing runs. */
static void
test_unclosed_conf_block(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *conf = test_write(f->conf, "20-open.conf",
                                     "# a block left open\nsync {\n  target = \"vllm\"\n"
                                     "  tp = 2\n");
  g_autofree char *out = path_in(f, "out");

  Run r = run_wsync(f, "plan", f->tiny, NULL);
  g_autofree char *msg = g_strdup_printf("%s:2: the block opened here is not closed", conf);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  r = run_wsync(f, "convert", f->tiny, out, NULL);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
  /* closed, the same text is good */
  g_free(test_write(f->conf, "20-open.conf", "sync {\n  target = \"vllm\"\n}\n"));
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

typedef struct {
  const volatile guint8 *map;
  gsize len;
  guint64 sum;
} Reader;

static void
read_all(gpointer data)
{
  Reader *r = data;
  for (gsize i = 0; i < r->len; i++)
    r->sum += r->map[i];
}

static void
host_sigbus(int sig)
{
  (void)sig;
  abort(); /* never called: no SIGBUS happens outside a guarded call */
}

/* The plain handler SIGBUS has now (SIG_DFL, a function; NULL for a siginfo one). */
static void (*sigbus_handler(void))(int)
{
  struct sigaction current;
  g_assert_cmpint(sigaction(SIGBUS, NULL, &current), ==, 0);
  return (current.sa_flags & SA_SIGINFO) != 0 ? NULL : current.sa_handler;
}

/* The mechanism under convert and verify: a read of a map whose file was truncated
 * returns FALSE with the address, from any thread, and reads that do not fault pass. */
static gpointer
guarded_read_in_thread(gpointer data)
{
  const void *address = NULL;
  gboolean ok = wsync_run_guarded(read_all, data, &address);
  return ok ? NULL : (gpointer)address;
}

static void
test_guarded_map_reads(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *path = path_in(f, "shrinks.bin");
  gsize len = 4 * (gsize)sysconf(_SC_PAGESIZE);
  g_autofree char *bytes = g_malloc0(len);
  g_assert_true(g_file_set_contents(path, bytes, (gssize)len, NULL));
  int fd = open(path, O_RDONLY);
  guint8 *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  g_assert_true(map != MAP_FAILED);

  /* a host program's own handler (Python's faulthandler) is back after each call */
  struct sigaction host = {.sa_handler = host_sigbus}, old_action;
  sigemptyset(&host.sa_mask);
  g_assert_cmpint(sigaction(SIGBUS, &host, &old_action), ==, 0);

  Reader r = {map, len, 0};
  const void *address = NULL;
  g_assert_true(wsync_run_guarded(read_all, &r, &address));
  g_assert_true(sigbus_handler() == host_sigbus);
  g_assert_cmpint(truncate(path, 0), ==, 0);
  for (int i = 0; i < 2; i++) { /* again: the guard works each time */
    r.sum = 0;
    g_assert_false(wsync_run_guarded(read_all, &r, &address));
    g_assert_true(address == map);
    g_assert_true(sigbus_handler() == host_sigbus);
  }
  GThread *t = g_thread_new("reader", guarded_read_in_thread, &r);
  g_assert_true(g_thread_join(t) == map);
  g_assert_true(sigbus_handler() == host_sigbus);
  g_assert_cmpint(sigaction(SIGBUS, &old_action, NULL), ==, 0);
  munmap(map, len);
}

/* A guarded call made inside another (on the same thread): its fault ends it alone, and
 * the outer call stays guarded after it returns, with or without a fault. */
typedef struct {
  Reader *inner; /* read inside a guarded call of its own */
  Reader *outer; /* read after it, by the outer call */
  gboolean inner_ok;
  const void *inner_address;
} Nested;

static void
read_nested(gpointer data)
{
  Nested *n = data;
  n->inner_ok = wsync_run_guarded(read_all, n->inner, &n->inner_address);
  read_all(n->outer);
}

static void
test_guarded_calls_nest(Fixture *f, gconstpointer data)
{
  (void)data;
  gsize len = 4 * (gsize)sysconf(_SC_PAGESIZE);
  g_autofree char *bytes = g_malloc0(len);
  guint8 *maps[2];
  for (int i = 0; i < 2; i++) {
    g_autofree char *path = g_strdup_printf("%s/nested-%d.bin", f->dir, i);
    g_assert_true(g_file_set_contents(path, bytes, (gssize)len, NULL));
    int fd = open(path, O_RDONLY);
    maps[i] = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    g_assert_true(maps[i] != MAP_FAILED);
    if (i == 1)
      g_assert_cmpint(truncate(path, 0), ==, 0); /* maps[1] faults */
  }
  /* a fault outside any guarded call would abort: the old code left the outer call
   * unguarded once the inner one returned */
  struct sigaction host = {.sa_handler = host_sigbus}, old_action;
  sigemptyset(&host.sa_mask);
  g_assert_cmpint(sigaction(SIGBUS, &host, &old_action), ==, 0);

  Reader good = {maps[0], len, 0}, bad = {maps[1], len, 0};
  const void *address = NULL;
  /* the inner call passes, then the outer one faults */
  Nested n = {&good, &bad, FALSE, NULL};
  g_assert_false(wsync_run_guarded(read_nested, &n, &address));
  g_assert_true(n.inner_ok);
  g_assert_true(address == maps[1]);
  /* the inner call faults, then the outer one faults too */
  Nested m = {&bad, &bad, TRUE, NULL};
  address = NULL;
  g_assert_false(wsync_run_guarded(read_nested, &m, &address));
  g_assert_false(m.inner_ok);
  g_assert_true(m.inner_address == maps[1] && address == maps[1]);
  /* the inner call faults, the outer one ends well */
  Nested k = {&bad, &good, TRUE, NULL};
  g_assert_true(wsync_run_guarded(read_nested, &k, &address));
  g_assert_false(k.inner_ok);
  g_assert_true(sigbus_handler() == host_sigbus);
  g_assert_cmpint(sigaction(SIGBUS, &old_action, NULL), ==, 0);
  munmap(maps[0], len);
  munmap(maps[1], len);
}

/* ------------------------------------------------------------------ a full disk */

/* A tmpfs of @bytes at @dir, in a mount namespace of this process's own: a real full
 * disk, without touching the machine's.  FALSE when this process may not mount. */
static gboolean
mount_small_tmpfs(const char *dir, guint64 bytes)
{
  g_autofree char *opts = g_strdup_printf("size=%" G_GUINT64_FORMAT, bytes);
  return unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
         g_mkdir_with_parents(dir, 0755) == 0 &&
         mount("wsync-test", dir, "tmpfs", 0, opts) == 0;
}

/* Whether a tmpfs can be mounted at @dir (made here) in a mount namespace of its own, tried
 * in a child that exits at once (its namespace, and the mount, go with it); when not, @why
 * says which step failed and why.  Root is not enough: a chroot or a container may refuse
 * unshare(CLONE_NEWNS) or mount(2) (EPERM, EINVAL).  The child makes only system calls:
 * GLib may have started threads in this process, and fork() copies none of their locks'
 * owners. */
static gboolean
can_mount_small_tmpfs(const char *dir, char **why)
{
  static const char *const steps[] = {"unshare(CLONE_NEWNS)", "make / private", "mount tmpfs"};
  int failed[2] = {0, 0}; /* the child's report: the step that failed, its errno */
  int fds[2];
  int status;

  g_assert_cmpint(g_mkdir_with_parents(dir, 0755), ==, 0);
  g_assert_cmpint(pipe(fds), ==, 0);
  pid_t pid = fork();
  g_assert_cmpint(pid, >=, 0);
  if (pid == 0) {
    int step = 0; /* the step that failed, from 1 (steps[step - 1]) */
    if (unshare(CLONE_NEWNS) != 0)
      step = 1;
    else if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
      step = 2;
    else if (mount("wsync-test", dir, "tmpfs", 0, "size=1048576") != 0)
      step = 3;
    int report[2] = {step, errno};
    _exit(step == 0 ? 0 : write(fds[1], report, sizeof report) == sizeof report ? 1 : 2);
  }
  close(fds[1]);
  gssize got = read(fds[0], failed, sizeof failed);
  close(fds[0]);
  g_assert_cmpint(waitpid(pid, &status, 0), ==, pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return TRUE;
  if (got == sizeof failed && failed[0] >= 1 && failed[0] <= 3)
    *why = g_strdup_printf("%s: %s", steps[failed[0] - 1], g_strerror(failed[1]));
  else
    *why = g_strdup_printf("the probe's child ended with wait status %d", status);
  return FALSE;
}

/* The bytes of tensor data `wsync convert` writes for @target_args. */
static guint64
output_bytes(Fixture *f, const char *target, const char *tp)
{
  Run r = run_wsync(f, "plan", f->tiny, "--target", target, "--tp", tp, "--json", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  guint64 bytes = (guint64)json_object_get_int_member(
      json_node_get_object(json_parser_get_root(parser)), "bytes");
  run_clear(&r);
  return bytes;
}

/* Grows the file @filler until the file system of @dir has @free bytes left. */
static void
leave_free(const char *dir, const char *filler, guint64 free_bytes)
{
  struct statvfs sv;
  struct stat st;
  int fd = open(filler, O_RDWR | O_CREAT, 0644);

  g_assert_cmpint(fd, >=, 0);
  g_assert_cmpint(statvfs(dir, &sv), ==, 0);
  g_assert_cmpint(fstat(fd, &st), ==, 0);
  guint64 avail = (guint64)sv.f_bavail * sv.f_frsize;
  g_assert_cmpuint(avail, >, free_bytes);
  g_assert_cmpint(posix_fallocate(fd, 0, st.st_size + (off_t)(avail - free_bytes)), ==, 0);
  close(fd);
}

/* The user's previous output in @out: the files of --target hf, and @weights its bytes. */
static void
assert_previous_output(const char *out, const char *weights, gsize len)
{
  g_autofree char *names = names_in(out);
  g_assert_cmpstr(names, ==, HF_FILES);
  g_autofree char *path = g_build_filename(out, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *now = NULL;
  gsize now_len = 0;
  g_assert_true(g_file_get_contents(path, &now, &now_len, NULL));
  g_assert_cmpmem(now, now_len, weights, len);
}

/* A full disk, on a real (small) file system: no output file is preallocated, so the
 * writes themselves must report it.  When the file system has room for the tensors
 * when the run starts but not for the files they end up in, a write fails with ENOSPC
 * (the file and the tensor named); when it has not even room for the tensors, the run
 * refuses before it writes anything.  Either way: exit 4, one line, the previous DST
 * as it was, no temporary left.  Needs root, to mount the tmpfs. */
static void
test_full_disk(Fixture *f, gconstpointer data)
{
  (void)data;
  if (!g_test_subprocess()) {
    if (geteuid() != 0) {
      g_test_skip("needs root, to mount a small tmpfs in a mount namespace of its own");
      return;
    }
    /* asked first, so that TAP says SKIP where it cannot run (it said ok: the subprocess
     * found it could not mount, said "not tested" in a comment, and passed) */
    g_autofree char *probe = path_in(f, "probe");
    g_autofree char *why = NULL;
    if (!can_mount_small_tmpfs(probe, &why)) {
      g_autofree char *skip =
          g_strdup_printf("cannot mount a small tmpfs in a mount namespace of its own (%s)", why);
      g_test_skip(skip);
      return;
    }
    g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_INHERIT_STDERR);
    g_test_trap_assert_passed();
    return;
  }
  g_autofree char *small = path_in(f, "small");
  g_autofree char *out = g_build_filename(small, "out", NULL);
  g_autofree char *filler = g_build_filename(small, "filler", NULL);
  guint64 hf = output_bytes(f, "hf", "1"), vllm = output_bytes(f, "vllm", "2");
  /* (the parent's probe could: failing here is this test's failure, not a skip) */
  if (!mount_small_tmpfs(small, 4 * hf + (1u << 20)))
    g_error("cannot mount a tmpfs at %s: %s", small, g_strerror(errno));
  /* the user's previous output (written across file systems: copy_file_range says EXDEV
   * and the executor writes from the maps) */
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *weights_path = g_build_filename(out, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *weights = NULL;
  gsize len = 0;
  g_assert_true(g_file_get_contents(weights_path, &weights, &len, NULL));

  /* room for the tensors' bytes and one page: not for the headers of the files too */
  leave_free(small, filler, vllm + 4096);
  r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--tp", "2", NULL);
  g_autofree char *prefix = g_strdup_printf("wsync: cannot write %s/.out.wsync-", small);
  if (r.status != 4 || !g_str_has_prefix(r.err, prefix) ||
      strstr(r.err, ": No space left on device (tensor \"") == NULL ||
      !g_str_has_suffix(r.err, "\")\n") || strchr(r.err, '\n') != r.err + strlen(r.err) - 1)
    g_error("exit %d, stderr \"%s\"", r.status, r.err);
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
  assert_previous_output(out, weights, len);
  assert_no_temporaries(small);

  /* not even room for the tensors: refused before anything is written */
  leave_free(small, filler, vllm / 2);
  r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--tp", "2", NULL);
  g_autofree char *refusal = g_strdup_printf(
      "wsync: cannot write %s: No space left on device (the output needs ", out);
  if (r.status != 4 || !g_str_has_prefix(r.err, refusal) ||
      !g_str_has_suffix(r.err, " free)\n") || strchr(r.err, '\n') != r.err + strlen(r.err) - 1)
    g_error("exit %d, stderr \"%s\"", r.status, r.err);
  run_clear(&r);
  assert_previous_output(out, weights, len);
  assert_no_temporaries(small);
  g_assert_cmpint(umount(small), ==, 0);
}

/* ------------------------------------------------------------------ hangs and memory */

static void
test_conf_d_fifo_and_huge(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *fifo = g_build_filename(f->conf, "20-fifo.conf", NULL);
  g_assert_cmpint(mkfifo(fifo, 0600), ==, 0);
  Run r = run_wsync(f, "plugins", NULL); /* used to block for ever */
  g_autofree char *msg = g_strdup_printf("%s: is a FIFO, not a regular file", fifo);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
  g_unlink(fifo);

  /* a 2 MiB file (sparse: it costs nothing) is refused unread */
  g_autofree char *huge = g_build_filename(f->conf, "20-huge.conf", NULL);
  g_free(test_write(f->conf, "20-huge.conf", ""));
  g_assert_cmpint(truncate(huge, 2 << 20), ==, 0);
  r = run_wsync(f, "plugins", NULL);
  g_autofree char *msg2 = g_strdup_printf(
      "%s: more than 1 MiB; a configuration file is never that big", huge);
  assert_refusal(&r, 2, msg2);
  run_clear(&r);
}

/* The index as a FIFO, a device or a huge file: refused at once, nothing read. */
static void
test_index_fifo_device_huge(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *index = g_build_filename(f->tiny, "model.safetensors.index.json", NULL);
  struct {
    const char *kind;
    const char *message;
  } cases[] = {{"fifo", "is a FIFO, not a regular file"},
               {"device", "is a device, not a regular file"},
               {"huge", "more than 64 MiB; a model.safetensors.index.json is never that big"}};

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_unlink(index);
    if (i == 0)
      g_assert_cmpint(mkfifo(index, 0600), ==, 0);
    else if (i == 1)
      g_assert_cmpint(symlink("/dev/zero", index), ==, 0);
    else {
      g_free(test_write(f->tiny, "model.safetensors.index.json", "{"));
      g_assert_cmpint(truncate(index, (off_t)1 << 32), ==, 0);
    }
    Run r = run_wsync(f, "inspect", f->tiny, NULL);
    g_autofree char *msg = g_strdup_printf("%s: %s", index, cases[i].message);
    assert_refusal(&r, 3, msg);
    run_clear(&r);
  }
}

static char *
edited_config(Fixture *f, const char *base, const char *name, const char *edits)
{
  g_autofree char *path = g_test_build_filename(G_TEST_DIST, "..", "configs", base, NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;
  json_parser_load_from_file(parser, path, &error);
  g_assert_no_error(error);
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  JsonObject *text = json_object_has_member(root, "text_config")
                         ? json_object_get_object_member(root, "text_config")
                         : root;
  g_autoptr(JsonParser) ep = json_parser_new();
  json_parser_load_from_data(ep, edits, -1, &error);
  g_assert_no_error(error);
  JsonObjectIter it;
  const char *key;
  JsonNode *value;
  json_object_iter_init(&it, json_node_get_object(json_parser_get_root(ep)));
  while (json_object_iter_next(&it, &key, &value))
    json_object_set_member(text, key, json_node_copy(value));
  g_autofree char *out = json_to_string(json_parser_get_root(parser), TRUE);
  return test_write(f->dir, name, out);
}

/* Counts are checked before anything iterates over them: these configs are refused at
 * once (num_hidden_layers near 2^31 with a long mlp_only_layers kept qwen3_moe busy
 * for hours). */
static void
test_model_counts_checked_first(Fixture *f, gconstpointer data)
{
  (void)data;
  GString *list = g_string_new("{\"num_hidden_layers\": 2147483646, \"mlp_only_layers\": [");
  for (int i = 0; i < 60000; i++)
    g_string_append_printf(list, "%s%d", i ? "," : "", i);
  g_string_append(list, "]}");
  g_autofree char *c1 = edited_config(f, "tiny-qwen3-moe.json", "c1.json", list->str);
  g_string_free(list, TRUE);
  g_autofree char *out = path_in(f, "out");
  Run r = run_wsync(f, "synth", "--config", c1, out, NULL);
  g_autofree char *m1 =
      g_strdup_printf("%s: field \"num_hidden_layers\" is 2147483646, more than 65536", c1);
  assert_refusal(&r, 3, m1);
  run_clear(&r);

  list = g_string_new("{\"mlp_only_layers\": [0");
  for (int i = 0; i < 65536; i++)
    g_string_append(list, ",1");
  g_string_append(list, "]}");
  g_autofree char *c2 = edited_config(f, "tiny-qwen3-moe.json", "c2.json", list->str);
  g_string_free(list, TRUE);
  r = run_wsync(f, "synth", "--config", c2, out, NULL);
  g_autofree char *m2 = g_strdup_printf(
      "%s: field \"mlp_only_layers\" has 65537 entries, more than 65536", c2);
  assert_refusal(&r, 3, m2);
  run_clear(&r);

  g_autofree char *c3 = edited_config(f, "tiny-qwen3-moe.json", "c3.json",
                                      "{\"num_hidden_layers\": 65536, \"num_experts\": 65536}");
  r = run_wsync(f, "synth", "--config", c3, out, NULL);
  g_autofree char *m3 = g_strdup_printf("%s: the config makes more than 1048576 tensors "
                                        "(model.layers.5.mlp adds 196608 to 983110)",
                                        c3);
  assert_refusal(&r, 3, m3);
  run_clear(&r);
  g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
}

static void
test_model_counts_checked_first_qwen3_5(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *so = g_build_filename(test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"),
                                         "qwen3_5_moe.so", NULL);
  if (!g_file_test(so, G_FILE_TEST_EXISTS)) {
    g_test_skip("the qwen3_5_moe plugin is not built (./configure --disable-plugin-qwen3_5_moe)");
    return;
  }
  g_free(test_write(f->conf, "20-q35.conf", "plugin \"qwen3_5_moe\" {}\n"));
  g_autofree char *c = edited_config(f, "tiny-qwen3.5-moe.json", "c.json",
                                     "{\"mtp_num_hidden_layers\": 65536, \"num_experts\": 4096}");
  g_autofree char *out = path_in(f, "out");
  Run r = run_wsync(f, "synth", "--config", c, out, NULL);
  g_autofree char *m = g_strdup_printf("%s: the config makes more than 1048576 tensors "
                                       "(mtp.layers.81.mlp adds 12288 to 1045896)",
                                       c);
  assert_refusal(&r, 3, m);
  run_clear(&r);
}

/* TRUE when the files hold the same bytes (read 1 MiB at a time). */
static gboolean
same_bytes(const char *a, const char *b)
{
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  g_autofree char *ba = g_malloc(1 << 20), *bb = g_malloc(1 << 20);
  gboolean same = fa != NULL && fb != NULL;

  while (same) {
    size_t na = fread(ba, 1, 1 << 20, fa), nb = fread(bb, 1, 1 << 20, fb);
    same = na == nb && memcmp(ba, bb, na) == 0;
    if (na == 0)
      break;
  }
  if (fa)
    fclose(fa);
  if (fb)
    fclose(fb);
  return same;
}

/* Only the files an engine reads are copied, streamed: a 256 MiB tokenizer.json goes
 * through a run whose data segment is limited to 32 MiB (whole, it was read into
 * memory); optimizer states and logs stay behind. */
static void
test_companion_files_streamed(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *tok = g_build_filename(f->tiny, "tokenizer.json", NULL);
  int fd = open(tok, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  g_assert_cmpint(fd, >=, 0);
  g_assert_cmpint(pwrite(fd, "{\"head\": 1", 10, 0), ==, 10);
  g_assert_cmpint(pwrite(fd, "middle", 6, 100 << 20), ==, 6);
  g_assert_cmpint(pwrite(fd, "tail}", 5, (256 << 20) - 5), ==, 5);
  close(fd);
  g_free(test_write(f->tiny, "chat_template.jinja", "{{ messages }}\n"));
  g_free(test_write(f->tiny, "generation_config.json", "{\"do_sample\": true}\n"));
  g_free(test_write(f->tiny, "optimizer.pt", "optimizer state, not for inference\n"));
  g_free(test_write(f->tiny, "trainer_state.json", "{}\n"));
  g_autofree char *runs = g_build_filename(f->tiny, "runs", NULL);
  g_mkdir(runs, 0755);

  g_autofree char *out = path_in(f, "out");
  gboolean limited = g_getenv("WSYNC_TEST_WRAPPER") == NULL && !TEST_UNDER_ASAN;
  struct rlimit old, lim;
  getrlimit(RLIMIT_DATA, &old);
  lim = old;
  lim.rlim_cur = 32 << 20; /* inherited by the wsync started below */
  if (limited)
    g_assert_cmpint(setrlimit(RLIMIT_DATA, &lim), ==, 0);
  else
    g_test_message("under valgrind or ASan: no data size limit (they need more themselves)");
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--threads", "2", "-q", NULL);
  if (limited)
    setrlimit(RLIMIT_DATA, &old);
  if (r.status != 0)
    g_error("exit %d: %s", r.status, r.err);
  run_clear(&r);
  g_autofree char *names = names_in(out);
  g_assert_cmpstr(names, ==, ".wsync-output chat_template.jinja config.json generation_config.json "
                             "model-rank-0-part-0.safetensors tokenizer.json");
  g_autofree char *copy = g_build_filename(out, "tokenizer.json", NULL);
  g_assert_true(same_bytes(tok, copy));

  /* a companion that is a FIFO is refused, not waited on */
  g_unlink(tok);
  g_assert_cmpint(mkfifo(tok, 0600), ==, 0);
  r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", NULL);
  g_autofree char *msg = g_strdup_printf("%s: is a FIFO, not a regular file", tok);
  assert_refusal(&r, 3, msg);
  run_clear(&r);
  g_unlink(tok);
  assert_no_temporaries(f->dir);
}

/* A Unix socket (bound, then left behind: its file stays) or a FIFO at @path. */
static void
make_special(const char *path, const char *kind)
{
  if (strcmp(kind, "FIFO") == 0) {
    g_assert_cmpint(mkfifo(path, 0600), ==, 0);
    return;
  }
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  g_assert_cmpuint(strlen(path), <, sizeof addr.sun_path);
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  g_assert_cmpint(fd, >=, 0);
  g_assert_cmpint(bind(fd, (struct sockaddr *)&addr, sizeof addr), ==, 0);
  close(fd);
}

/* The safetensors reader (a safetensors file, a shard) says "PATH: not a regular file",
 * the readers of config.json, the index and companions "PATH: is a FIFO, not a regular
 * file" (core/files.c): each the same for a socket as for a FIFO. */
typedef enum { SAFETENSORS_WORDS, KIND_WORDS } Words;

/* @path made a socket or a FIFO (@kind), then wsync @args: refused, exit 3, in @words,
 * nothing on stdout, no DST; @path removed again. */
static void
assert_special_refused(Fixture *f, const char *path, const char *kind, Words words,
                       const char *dst, const char *first, ...)
{
  g_autoptr(GPtrArray) args = g_ptr_array_new();
  va_list ap;

  make_special(path, kind);
  va_start(ap, first);
  for (const char *a = first; a != NULL; a = va_arg(ap, const char *))
    g_ptr_array_add(args, (gpointer)a);
  va_end(ap);
  Run r = run_args(f, args);
  g_autofree char *msg = words == SAFETENSORS_WORDS
                             ? g_strdup_printf("%s: not a regular file", path)
                             : g_strdup_printf("%s: is a %s, not a regular file", path, kind);
  if (r.status != 3 || g_strcmp0(r.out, "") != 0)
    g_error("wsync %s with %s a %s: exit %d, stdout \"%s\", stderr \"%s\"", first, path, kind,
            r.status, r.out, r.err);
  assert_refusal(&r, 3, msg);
  run_clear(&r);
  g_assert_false(dst != NULL && g_file_test(dst, G_FILE_TEST_EXISTS));
  g_assert_cmpint(g_unlink(path), ==, 0);
}

/* Every command that reads files refuses a socket as it refuses a FIFO, in the same
 * words, exit 3, whether the command line names it or a checkpoint holds it.  (A socket
 * was "cannot open PATH: No such device or address", exit 4: open(2) fails on one
 * before fstat() can tell.) */
static void
test_socket_refused_as_fifo(Fixture *f, gconstpointer data)
{
  (void)data;
  static const char *const kinds[] = {"socket", "FIFO"};
  g_autofree char *odd = path_in(f, "odd");
  g_autofree char *odd_dir = path_in(f, "elsewhere");
  g_autofree char *odd_config = g_build_filename(odd_dir, "config.json", NULL);
  g_autofree char *dst = path_in(f, "out");
  g_autofree char *config = g_build_filename(f->tiny, "config.json", NULL);
  g_autofree char *saved_config = path_in(f, "config.json.saved");
  g_autofree char *index = g_build_filename(f->tiny, "model.safetensors.index.json", NULL);
  g_autofree char *saved_index = path_in(f, "index.saved");
  g_autofree char *shard = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *saved_shard = path_in(f, "shard.saved");
  g_autofree char *tok = g_build_filename(f->tiny, "tokenizer.json", NULL);

  g_assert_cmpint(g_mkdir(odd_dir, 0700), ==, 0);
  for (guint k = 0; k < G_N_ELEMENTS(kinds); k++) {
    const char *kind = kinds[k];
    /* named on the command line */
    assert_special_refused(f, odd, kind, SAFETENSORS_WORDS, NULL, "inspect", odd, NULL);
    assert_special_refused(f, odd, kind, SAFETENSORS_WORDS, NULL, "verify", odd, f->tiny, NULL);
    assert_special_refused(f, odd, kind, SAFETENSORS_WORDS, NULL, "verify", f->tiny, odd, NULL);
    assert_special_refused(f, odd, kind, SAFETENSORS_WORDS, NULL, "plan", odd, "--target",
                           "vllm", NULL);
    assert_special_refused(f, odd, kind, SAFETENSORS_WORDS, dst, "convert", odd, dst, "--target",
                           "vllm", NULL);
    assert_special_refused(f, odd, kind, KIND_WORDS, NULL, "config", odd, NULL);
    assert_special_refused(f, odd, kind, KIND_WORDS, dst, "synth", "--config", odd, dst, NULL);
    assert_special_refused(f, odd_config, kind, KIND_WORDS, dst, "convert", f->tiny, dst,
                           "--target", "vllm", "--config", odd_config, NULL);
    /* held by the checkpoint: its config.json, its index, a shard, a companion */
    g_assert_cmpint(g_rename(config, saved_config), ==, 0);
    assert_special_refused(f, config, kind, KIND_WORDS, NULL, "plan", f->tiny, "--target", "vllm",
                           NULL);
    g_assert_cmpint(g_rename(saved_config, config), ==, 0);
    g_assert_cmpint(g_rename(index, saved_index), ==, 0);
    assert_special_refused(f, index, kind, KIND_WORDS, NULL, "inspect", f->tiny, NULL);
    g_assert_cmpint(g_rename(saved_index, index), ==, 0);
    g_assert_cmpint(g_rename(shard, saved_shard), ==, 0);
    assert_special_refused(f, shard, kind, SAFETENSORS_WORDS, NULL, "verify", f->tiny, f->tiny,
                           NULL);
    g_assert_cmpint(g_rename(saved_shard, shard), ==, 0);
    assert_special_refused(f, tok, kind, KIND_WORDS, dst, "convert", f->tiny, dst, "--target",
                           "vllm", NULL);
  }
  /* and the checkpoint, whole again, converts */
  Run r = run_wsync(f, "convert", f->tiny, dst, "--target", "vllm", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  assert_no_temporaries(f->dir);
}

/* ------------------------------------------------------------------ signals and leftovers */

/* The ".out.wsync-*" directories in the fixture's directory. */
static guint
count_temporaries(Fixture *f)
{
  g_autoptr(GDir) d = g_dir_open(f->dir, 0, NULL);
  const char *name;
  guint n = 0;

  while ((name = g_dir_read_name(d)) != NULL)
    n += g_str_has_prefix(name, ".out.wsync-");
  return n;
}

static void
saboteur_signal(Fixture *f, int sig)
{
  g_autofree char *conf = g_strdup_printf("plugin \"saboteur\" {\n  signal = %d\n}\n", sig);
  g_free(test_write(f->conf, "20-saboteur.conf", conf));
}

/* SIGTERM and SIGINT while the temporary is full of preallocated files: it is removed,
 * the previous DST stays, and wsync ends by that signal. */
static void
test_signal_removes_temporary(Fixture *f, gconstpointer data)
{
  (void)data;
  const int signals[] = {SIGTERM, SIGINT, SIGHUP};
  const char *names[] = {"SIGTERM", "SIGINT", "SIGHUP"};
  g_autofree char *out = path_in(f, "out");
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);

  for (guint i = 0; i < G_N_ELEMENTS(signals); i++) {
    saboteur_signal(f, signals[i]);
    r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--tp", "2", NULL);
    g_assert_cmpint(r.signal, ==, signals[i]);
    g_autofree char *msg = g_strdup_printf(
        "wsync: interrupted by %s: the temporary directory is removed; DST is as it was\n",
        names[i]);
    g_assert_cmpstr(r.err, ==, msg);
    g_assert_cmpstr(r.out, ==, "");
    run_clear(&r);
    g_assert_cmpuint(count_temporaries(f), ==, 0);
    g_autofree char *names_now = names_in(out);
    g_assert_cmpstr(names_now, ==, HF_FILES);
  }
}

/* WSYNC_TEST_SIGNAL_AFTER=@phase (core/exec.c, signal_if_asked()): SIGTERM at that exact
 * point of the end of convert, where no signal from outside lands reliably. */
static Run
run_signalled_after(Fixture *f, const char *phase, const char *first, ...)
{
  g_autoptr(GPtrArray) args = g_ptr_array_new();
  va_list ap;

  va_start(ap, first);
  for (const char *a = first; a != NULL; a = va_arg(ap, const char *))
    g_ptr_array_add(args, (gpointer)a);
  va_end(ap);
  g_setenv("WSYNC_TEST_SIGNAL_AFTER", phase, TRUE);
  Run r = run_args(f, args);
  g_unsetenv("WSYNC_TEST_SIGNAL_AFTER");
  return r;
}

/* A signal caught after the swap stopped nothing, and used to end convert, merge or
 * synth silently by it (core/main.c, cli_end_by_caught_signal()): stderr empty, the
 * report on stdout lost with the unflushed buffer, so that neither a user nor a script
 * could tell whether DST was the new output.  Now one line says so, after the report,
 * and wsync ends by the signal.  A signal caught right before the swap still stops the
 * run with its line and DST as it was. */
static void
test_signal_after_swap(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *out = path_in(f, "out");
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *weights_path = g_build_filename(out, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *weights = NULL;
  gsize len = 0;
  g_assert_true(g_file_get_contents(weights_path, &weights, &len, NULL));

  /* before the swap: stopped, DST as it was */
  r = run_signalled_after(f, "marker written", "convert", f->tiny, out, "--target", "vllm",
                          "--tp", "2", NULL);
  g_assert_cmpint(r.signal, ==, SIGTERM);
  g_assert_cmpstr(r.err, ==,
                  "wsync: interrupted by SIGTERM: the temporary directory is removed; DST is "
                  "as it was\n");
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
  assert_no_temporaries(f->dir);
  assert_previous_output(out, weights, len);

  /* after the swap: the report, the line, death by the signal, DST the new output */
  r = run_signalled_after(f, "swap ended", "convert", f->tiny, out, "--target", "vllm",
                          "--tp", "2", NULL);
  g_assert_cmpint(r.signal, ==, SIGTERM);
  g_assert_cmpstr(r.err, ==,
                  "wsync: convert: interrupted by SIGTERM after DST was swapped in: DST is the "
                  "new output, complete\n");
  g_autofree char *names = names_in(out);
  g_assert_cmpstr(names, ==, VLLM_TP2_FILES);
  assert_no_temporaries(f->dir);
  Run again = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(again.status, ==, 0);
  g_assert_true(g_str_has_prefix(again.out, "wrote "));
  g_assert_cmpstr(r.out, ==, again.out); /* the report, whole */
  run_clear(&again);
  run_clear(&r);

  /* -q --json into a new DST (renamed, not swapped): the JSON, then the line */
  g_autofree char *fresh = path_in(f, "fresh");
  r = run_signalled_after(f, "swap ended", "--json", "-q", "convert", f->tiny, fresh,
                          "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.signal, ==, SIGTERM);
  g_assert_cmpstr(r.err, ==,
                  "wsync: convert: interrupted by SIGTERM after DST was swapped in: DST is the "
                  "new output, complete\n");
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  g_assert_true(JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)));
  run_clear(&r);
  g_autofree char *fresh_names = names_in(fresh);
  g_assert_cmpstr(fresh_names, ==, VLLM_TP2_FILES);

  /* a swap whose parent could not be synced: its own line says what DST is (in place,
   * the previous kept), and the signal adds none */
  g_setenv("WSYNC_TEST_FAIL_SWAP_SYNC", "1", TRUE);
  r = run_signalled_after(f, "swap ended", "convert", f->tiny, out, "--target", "hf", NULL);
  g_unsetenv("WSYNC_TEST_FAIL_SWAP_SYNC");
  g_assert_cmpint(r.signal, ==, SIGTERM);
  g_autofree char *not_durable = g_strdup_printf(
      "wsync: %s is in place, but its durability is not confirmed (it may not survive a "
      "crash): cannot sync %s: Input/output error; the previous output is kept as "
      "%s.wsync-previous: remove it once the new one is confirmed\n",
      out, f->dir, out);
  g_assert_cmpstr(r.err, ==, not_durable);
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
  g_autofree char *hf_names = names_in(out);
  g_assert_cmpstr(hf_names, ==, HF_FILES);

  /* synth: the same line, its own name */
  g_autofree char *config = tiny_config();
  g_autofree char *synth = path_in(f, "synth");
  r = run_signalled_after(f, "swap ended", "synth", "--config", config, synth, NULL);
  g_assert_cmpint(r.signal, ==, SIGTERM);
  g_assert_cmpstr(r.err, ==,
                  "wsync: synth: interrupted by SIGTERM after DST was swapped in: DST is the "
                  "new output, complete\n");
  g_assert_true(g_str_has_prefix(r.out, "wrote "));
  run_clear(&r);
  assert_no_temporaries(f->dir);
}

/* A signal while plan, convert or synth plans (a whole model takes seconds, and its files'
 * headers are read in one step) ends wsync at once, by the signal, after its line;
 * nothing is written.  Before: no handler while planning, so the signal's default
 * action ended it without a word (WSYNC_TEST_SIGNAL_AFTER="planning began" raises
 * SIGTERM as planning begins, core/plan.c). */
static void
test_signal_while_planning(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *out = path_in(f, "out");
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *weights_path = g_build_filename(out, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *weights = NULL;
  gsize len = 0;
  g_assert_true(g_file_get_contents(weights_path, &weights, &len, NULL));

  r = run_signalled_after(f, "planning began", "convert", f->tiny, out, "--target", "vllm",
                          "--tp", "2", NULL);
  g_assert_cmpint(r.signal, ==, SIGTERM);
  g_assert_cmpstr(r.err, ==, "wsync: planning was interrupted by SIGTERM\n");
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
  assert_no_temporaries(f->dir);
  assert_previous_output(out, weights, len);

  r = run_signalled_after(f, "planning began", "--json", "plan", f->tiny, "--target", "vllm",
                          NULL);
  g_assert_cmpint(r.signal, ==, SIGTERM);
  g_assert_cmpstr(r.err, ==, "wsync: planning was interrupted by SIGTERM\n");
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);

  /* synth plans too (a whole model's layout): the same line, no DST */
  g_autofree char *config = tiny_config();
  g_autofree char *synth = path_in(f, "synth");
  r = run_signalled_after(f, "planning began", "synth", "--config", config, synth, NULL);
  g_assert_cmpint(r.signal, ==, SIGTERM);
  g_assert_cmpstr(r.err, ==, "wsync: planning was interrupted by SIGTERM\n");
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
  g_assert_false(g_file_test(synth, G_FILE_TEST_EXISTS));
  assert_no_temporaries(f->dir);
}

/* kill -9 cannot be caught: its temporary stays, and the next run into the same DST
 * removes it (nobody holds its lock any more). */
static void
test_stale_temporary_removed_by_next_run(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *out = path_in(f, "out");
  saboteur_signal(f, SIGKILL);
  for (int i = 0; i < 3; i++) { /* each run removes the one before it left */
    Run r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--tp", "2", NULL);
    g_assert_cmpint(r.signal, ==, SIGKILL);
    run_clear(&r);
    g_assert_cmpuint(count_temporaries(f), ==, 1);
  }
  /* an unrelated directory with a similar name is not wsync's */
  g_autofree char *lookalike = path_in(f, ".out.wsync-notmine-keep");
  g_mkdir(lookalike, 0755);
  g_autofree char *other = path_in(f, ".other.wsync-abcdef");
  g_mkdir(other, 0755);

  saboteur_signal(f, 0);
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--tp", "2", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_assert_cmpuint(count_temporaries(f), ==, 1); /* the look-alike */
  g_assert_true(g_file_test(lookalike, G_FILE_TEST_IS_DIR));
  g_assert_true(g_file_test(other, G_FILE_TEST_IS_DIR));
  g_autofree char *names = names_in(out);
  g_assert_cmpstr(names, ==, VLLM_TP2_FILES);
}

/* kill -9 after every tensor is written (the saboteur's signal comes while config.json
 * is written): the previous DST is as it was, byte for byte. */
static void
test_kill_leaves_previous_dst(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *out = path_in(f, "out");
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *weights_path = g_build_filename(out, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *weights = NULL;
  gsize len = 0;
  g_assert_true(g_file_get_contents(weights_path, &weights, &len, NULL));

  saboteur_signal(f, SIGKILL);
  r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.signal, ==, SIGKILL);
  run_clear(&r);
  g_assert_cmpuint(count_temporaries(f), ==, 1);
  assert_previous_output(out, weights, len);
}

/* A temporary whose run still holds its lock is another run's work in progress: left. */
static void
test_running_temporary_left_alone(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *out = path_in(f, "out");
  g_autofree char *live = path_in(f, ".out.wsync-Live01");
  g_mkdir(live, 0755);
  g_free(test_write(live, "model-rank-0-part-0.safetensors", "being written"));
  int fd = open(live, O_RDONLY | O_DIRECTORY);
  g_assert_cmpint(flock(fd, LOCK_EX | LOCK_NB), ==, 0);

  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *names = names_in(live);
  g_assert_cmpstr(names, ==, "model-rank-0-part-0.safetensors");

  close(fd); /* that run ended without cleaning up */
  r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_assert_false(g_file_test(live, G_FILE_TEST_EXISTS));
}

/* A leftover that another user owns is not this user's to remove. */
static void
test_other_users_temporary_left_alone(Fixture *f, gconstpointer data)
{
  (void)data;
  if (geteuid() != 0) {
    g_test_skip("needs root, to give a directory to another user");
    return;
  }
  g_autofree char *out = path_in(f, "out");
  g_autofree char *theirs = path_in(f, ".out.wsync-Their5");
  g_mkdir(theirs, 0755);
  g_assert_cmpint(chown(theirs, 65534, 65534), ==, 0);
  Run r = run_wsync(f, "convert", f->tiny, out, "--target", "vllm", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_assert_true(g_file_test(theirs, G_FILE_TEST_IS_DIR));
}

/* ------------------------------------------------------------------ messages */

/* Exit @status, and stderr one line that begins with @prefix (escaped text included).
 * (Every run is also checked by testutil.h: stderr lines only, no control character.) */
static void
assert_one_line(Run *r, int status, const char *prefix)
{
  g_autofree char *expect = g_strdup_printf("wsync: %s", prefix);
  const char *nl = strchr(r->err, '\n');
  if (r->status != status || !g_str_has_prefix(r->err, expect) || nl == NULL || nl[1] != '\0')
    g_error("expected exit %d and one line starting \"%s\", got exit %d and \"%s\"", status,
            expect, r->status, r->err);
}

/* Shard names from the index reach I/O and bad-input messages: escaped, and a name that
 * cannot be a file is bad input (3), not an I/O failure. */
static void
test_shard_names_in_messages(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *index = g_build_filename(f->tiny, "model.safetensors.index.json", NULL);
  g_autofree char *original = read_text(index);
  g_autofree char *long_name = g_strnfill(300, 'x');
  struct {
    const char *shard; /* as JSON */
    const char *shown;
    const char *problem;
  } cases[] = {
      {"evil\\n\\u001b[31mred.safetensors", "evil\\x0a\\x1b[31mred.safetensors", "is missing"},
      {NULL, NULL, "cannot be a file: File name too long"},
      {"sub", "sub", NULL},
  };
  g_autofree char *sub = g_build_filename(f->tiny, "sub", NULL);
  g_mkdir(sub, 0755);

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    const char *shard = cases[i].shard ? cases[i].shard : long_name;
    const char *shown = cases[i].shown ? cases[i].shown : long_name;
    /* the first tensor of the index is named for that shard */
    GString *text = g_string_new(original);
    const char *at = strstr(text->str, "\"model-00001-of-00001.safetensors\"");
    g_assert_nonnull(at);
    g_string_erase(text, at - text->str, strlen("\"model-00001-of-00001.safetensors\""));
    g_autofree char *quoted = g_strdup_printf("\"%s\"", shard);
    g_string_insert(text, at - text->str, quoted);
    g_free(test_write(f->tiny, "model.safetensors.index.json", text->str));
    g_string_free(text, TRUE);

    Run r = run_wsync(f, "inspect", f->tiny, NULL);
    g_autofree char *prefix = NULL;
    if (cases[i].problem)
      prefix = g_strdup_printf("%s: shard \"%s\" (named for tensor \"", index, shown);
    else
      prefix = g_strdup_printf("%s/%s: is a directory, not a safetensors file", f->tiny, shown);
    assert_one_line(&r, 3, prefix);
    if (cases[i].problem)
      assert_has(r.err, cases[i].problem);
    run_clear(&r);
  }
}

/* json-glib's parse messages quote the text: a config.json stays one line. */
static void
test_config_json_parse_message(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *config = g_build_filename(f->tiny, "config.json", NULL);
  g_free(test_write(f->tiny, "config.json", "{\"model_type\": \"qwen3_moe\",\n  \"a\": tru\x07\x1b[31me\n}\n"));
  Run r = run_wsync(f, "plan", f->tiny, "--target", "vllm", NULL);
  g_autofree char *prefix = g_strdup_printf("%s: not valid JSON at 2:", config);
  assert_one_line(&r, 3, prefix);
  run_clear(&r);

  /* a model_type of another type is refused in words, not with json-glib's warning */
  g_free(test_write(f->tiny, "config.json", "{\"model_type\": {\"qwen3_moe\": 1}}\n"));
  r = run_wsync(f, "plan", f->tiny, "--target", "vllm", NULL);
  g_autofree char *msg = g_strdup_printf("%s: no \"model_type\" string", config);
  assert_refusal(&r, 3, msg);
  run_clear(&r);
}

/* A plugin's option validator quotes the value; libconfuse quotes tokens; a plugin name
 * can hold anything: all come out as one escaped line. */
static void
test_conf_values_in_messages(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *conf = test_write(f->conf, "20-evil.conf",
                                     "plugin \"vllm\" {\n  vllm-version = \"0.1\\n\\x1b[2Jgone\"\n}\n");
  Run r = run_wsync(f, "plugins", NULL);
  g_autofree char *prefix = g_strdup_printf("%s:2: ", conf);
  assert_one_line(&r, 2, prefix);
  assert_has(r.err, "\"0.1\\x0a\\x1b[2Jgone\"");
  run_clear(&r);

  g_free(test_write(f->conf, "20-evil.conf", "plugin \"a\\nb\\x1b[31m\" {}\n"));
  r = run_wsync(f, "plugins", NULL);
  g_autofree char *msg = g_strdup_printf(
      "%s:1: invalid plugin name \"a\\x0ab\\x1b[31m\" (letters, digits, '-' and '_' only)", conf);
  assert_refusal(&r, 2, msg);
  run_clear(&r);
}

/* Writes a one-tensor safetensors file whose __metadata__ is @metadata (JSON). */
static void
write_rank_file(const char *path, const char *metadata)
{
  g_autofree char *header = g_strdup_printf(
      "{\"__metadata__\": %s, \"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": "
      "[0, 4]}}",
      metadata);
  gsize n = strlen(header);
  GString *bytes = g_string_new(NULL);
  for (int i = 0; i < 8; i++)
    g_string_append_c(bytes, (char)((n >> (8 * i)) & 0xff));
  g_string_append_len(bytes, header, n);
  g_string_append_len(bytes, "\0\0\0\0", 4);
  GError *error = NULL;
  g_file_set_contents(path, bytes->str, bytes->len, &error);
  g_assert_no_error(error);
  g_string_free(bytes, TRUE);
}

/* Rank files' metadata values reach the planner's messages. */
static void
test_rank_metadata_in_messages(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dir = path_in(f, "ranks");
  g_mkdir(dir, 0755);
  g_autofree char *config = tiny_config();
  g_autofree char *copy = g_build_filename(dir, "config.json", NULL);
  test_copy(config, copy);
  g_autofree char *rank = g_build_filename(dir, "model-rank-0-part-0.safetensors", NULL);
  write_rank_file(rank, "{\"wsync.target\": \"vllm\", \"wsync.format\": "
                        "\"kernel\\n\\u001b[31mevil\", \"wsync.tp\": \"2\", "
                        "\"wsync.ep\": \"1\", \"wsync.world\": \"2\", \"wsync.rank\": \"0\"}");
  Run r = run_wsync(f, "plan", dir, "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, "kernel\\x0a\\x1b[31mevil");
  g_assert_nonnull(strchr(r.err, '\n'));
  g_assert_cmpstr(strchr(r.err, '\n'), ==, "\n");
  run_clear(&r);
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
  ADD("/reliability/conf/unclosed-block", test_unclosed_conf_block);
  ADD("/reliability/crash/source-shrinks", test_source_shrinks_while_converting);
  ADD("/reliability/crash/guarded-map-reads", test_guarded_map_reads);
  ADD("/reliability/crash/guarded-calls-nest", test_guarded_calls_nest);
  ADD("/reliability/crash/full-disk", test_full_disk);
  ADD("/reliability/hang/conf-d-fifo-and-huge", test_conf_d_fifo_and_huge);
  ADD("/reliability/hang/index-fifo-device-huge", test_index_fifo_device_huge);
  ADD("/reliability/input/socket-refused-as-fifo", test_socket_refused_as_fifo);
  ADD("/reliability/memory/model-counts", test_model_counts_checked_first);
  ADD("/reliability/memory/model-counts-qwen3_5", test_model_counts_checked_first_qwen3_5);
  ADD("/reliability/memory/companion-files", test_companion_files_streamed);
  ADD("/reliability/signal/removes-temporary", test_signal_removes_temporary);
  ADD("/reliability/signal/after-swap", test_signal_after_swap);
  ADD("/reliability/signal/while-planning", test_signal_while_planning);
  ADD("/reliability/signal/stale-temporary-removed", test_stale_temporary_removed_by_next_run);
  ADD("/reliability/signal/kill-leaves-previous-dst", test_kill_leaves_previous_dst);
  ADD("/reliability/signal/running-temporary-left", test_running_temporary_left_alone);
  ADD("/reliability/signal/other-users-temporary-left", test_other_users_temporary_left_alone);
  ADD("/reliability/message/shard-names", test_shard_names_in_messages);
  ADD("/reliability/message/config-json-parse", test_config_json_parse_message);
  ADD("/reliability/message/conf-values", test_conf_values_in_messages);
  ADD("/reliability/message/rank-metadata", test_rank_metadata_in_messages);
  return g_test_run();
}
