/* wsync: the files that go beside the weight files of an output directory: config.json
 * through the config patchers, and the source's companion files, streamed. */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <wsync/checkpoint.h>
#include <wsync/plan.h>

#include "companion.h"
#include "files.h"
#include "plan-private.h"

#define COPY_BYTES (1u << 20) /* companion files are copied this much at a time */

gboolean
companion_interrupted(GError **error, int sig)
{
  g_clear_error(error); /* what failed because of the signal (EINTR) matters no more */
  const char *name = sigabbrev_np(sig);
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
              "interrupted by SIG%s: the temporary directory is removed; DST is as it was",
              name ? name : "NAL");
  return FALSE;
}

/* Copies the bytes [@pos, @end) of @in to the same place in @out: copy_file_range (no
 * copy through user space, reflinks where the file system has them), or 1 MiB at a
 * time through a buffer where it cannot. */
static gboolean
copy_range(int in, int out, off_t pos, off_t end, const char *from, const char *to,
           const volatile sig_atomic_t *stop, GError **error)
{
  g_autofree guint8 *buf = NULL;

  while (pos < end) {
    if (stop != NULL && *stop)
      return companion_interrupted(error, *stop);
    gsize want = (gsize)MIN(end - pos, (off_t)COPY_BYTES);
    ssize_t k;
    if (buf == NULL) {
      loff_t a = pos, b = pos;
      k = copy_file_range(in, &a, out, &b, want, 0);
      if (k < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                    errno == EOPNOTSUPP || errno == EBADF)) {
        buf = g_malloc(COPY_BYTES);
        continue;
      }
    } else {
      k = pread(in, buf, want, pos);
      if (k > 0) {
        ssize_t w = 0;
        while (w < k) {
          ssize_t n = pwrite(out, buf + w, (gsize)(k - w), pos + w);
          if (n < 0 && errno == EINTR)
            continue;
          if (n <= 0) {
            wsync_set_io_error(error, n < 0 ? errno : ENOSPC, to, "write");
            return FALSE;
          }
          w += n;
        }
      }
    }
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      wsync_set_io_error(error, errno, from, "copy");
      return FALSE;
    }
    if (k == 0) {
      g_autofree char *pfrom = wsync_printable(from);
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
                  "cannot read %s: the file shrank while wsync was copying it", pfrom);
      return FALSE;
    }
    pos += k;
  }
  return TRUE;
}

/* Copies the regular file @from to the new file @to, streaming (a file of any size
 * costs COPY_BYTES of memory at most) and keeping the holes of a sparse file, then
 * syncs it.  A symlink in SRC is followed (the Hugging Face cache links snapshots to
 * blobs); anything but a regular file at its end is refused. */
static gboolean
copy_file(const char *from, const char *to, const volatile sig_atomic_t *stop, GError **error)
{
  struct stat st;
  gboolean ok = TRUE;

  /* a FIFO, a device and a socket (which cannot even be opened) are refused in one
   * wording by wsync_file_open_regular(), by fstat() of what it opened */
  int in = wsync_file_open_regular(from, FALSE, WSYNC_ERROR_BAD_INPUT, &st, error);
  if (in < 0)
    return FALSE;
  int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (out < 0) {
    wsync_set_io_error(error, errno, to, "create");
    close(in);
    return FALSE;
  }
  for (off_t pos = 0; ok && pos < st.st_size;) {
    off_t data = lseek(in, pos, SEEK_DATA);
    if (data < 0 && errno == ENXIO)
      break; /* a hole up to the end */
    if (data < 0)
      data = pos; /* no SEEK_DATA here: copy everything */
    off_t hole = lseek(in, data, SEEK_HOLE);
    if (hole < 0 || hole > st.st_size)
      hole = st.st_size;
    ok = copy_range(in, out, data, hole, from, to, stop, error);
    pos = hole;
  }
  if (ok && ftruncate(out, st.st_size) != 0) { /* a trailing hole */
    wsync_set_io_error(error, errno, to, "resize");
    ok = FALSE;
  }
  if (ok && fsync(out) != 0) {
    wsync_set_io_error(error, errno, to, "sync");
    ok = FALSE;
  }
  close(in);
  if (close(out) != 0 && ok) {
    wsync_set_io_error(error, errno, to, "close");
    ok = FALSE;
  }
  return ok;
}

static char *
config_text(JsonNode *root)
{
  g_autoptr(JsonGenerator) gen = json_generator_new();
  json_generator_set_pretty(gen, TRUE);
  json_generator_set_indent(gen, 2);
  json_generator_set_root(gen, root);
  g_autofree char *text = json_generator_to_data(gen, NULL);
  return g_strconcat(text, "\n", NULL);
}

gboolean
companion_write_config(WsyncContext *ctx, JsonNode *config, const char *src_config,
                       const char *dir, const volatile sig_atomic_t *stop, GError **error)
{
  g_autofree char *out = g_build_filename(dir, "config.json", NULL);
  g_autoptr(JsonNode) patched = json_node_copy(config);
  g_autofree char *before = config_text(config);

  if (!wsync_context_patch_config(ctx, patched, error))
    return FALSE;
  g_autofree char *after = config_text(patched);
  if (src_config != NULL && strcmp(before, after) == 0)
    return copy_file(src_config, out, stop, error);
  if (!g_file_set_contents(out, after, -1, NULL)) {
    wsync_set_io_error(error, errno, out, "write");
    return FALSE;
  }
  return TRUE;
}

/* The files next to the weights that Transformers and vLLM read when they load a
 * checkpoint directory: the generation config, the tokenizer (its fast and slow forms:
 * BPE, WordPiece, SentencePiece and tiktoken vocabularies), the chat template and the
 * processor configs of multimodal models.  Only these are copied (config.json goes
 * through the config patchers): a trainer's directory also holds optimizer and RNG
 * states, training arguments and logs that no inference engine reads, and copying a
 * 3 GB optimizer.pt into every converted checkpoint helps nobody.  These are the
 * Hugging Face directory format's own names, like the index's, not any model's. */
static const char *const companion_names[] = {
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
    "spiece.model", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
    "processor_config.json", "video_preprocessor_config.json"};

static gboolean
is_companion(const char *name)
{
  for (guint i = 0; i < G_N_ELEMENTS(companion_names); i++)
    if (strcmp(name, companion_names[i]) == 0)
      return TRUE;
  return g_str_has_suffix(name, ".tiktoken");
}

gboolean
companion_copy_dir(WsyncContext *ctx, JsonNode *config, const char *src_dir, const char *dir,
                   gboolean want_config, const volatile sig_atomic_t *stop, GError **error)
{
  g_autoptr(GDir) d = g_dir_open(src_dir, 0, NULL);
  const char *name;

  while (d != NULL && (name = g_dir_read_name(d)) != NULL) {
    g_autofree char *from = g_build_filename(src_dir, name, NULL);
    g_autofree char *to = g_build_filename(dir, name, NULL);
    if (strcmp(name, "config.json") == 0) {
      if (want_config && !companion_write_config(ctx, config, from, dir, stop, error))
        return FALSE;
    } else if (is_companion(name) && !copy_file(from, to, stop, error))
      return FALSE;
  }
  g_autofree char *written = g_build_filename(dir, "config.json", NULL);
  if (want_config && !g_file_test(written, G_FILE_TEST_EXISTS))
    return companion_write_config(ctx, config, NULL, dir, stop, error);
  return TRUE;
}

/* config.json (patched) and the companion files of the source directory, or of the
 * directory --config names (whatever the source: a file's too). */
gboolean
companion_write_for_plan(WsyncPlan *plan, const char *dir, const volatile sig_atomic_t *stop,
                         GError **error)
{
  if (plan->kind == PLAN_SYNTH ||
      (!plan->config_given && plan->input != NULL && !wsync_checkpoint_is_dir(plan->input)))
    return companion_write_config(plan->ctx, plan->config, NULL, dir, stop, error);
  const char *from = plan->model_dir != NULL ? plan->model_dir : plan->src;
  return companion_copy_dir(plan->ctx, plan->config, from, dir, !plan->no_config, stop, error);
}
