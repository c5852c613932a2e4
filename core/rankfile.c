/* wsync: the rank files of a plan's output layouts, as `wsync convert` writes them,
 * before any of them exists (see rankfile.h). */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rankfile.h"

void
rank_file_free(gpointer data)
{
  RankFile *f = data;

  g_free(f->name);
  g_free(f->header);
  g_array_unref(f->tensors);
  g_free(f);
}

static gint
compare_offsets(gconstpointer a, gconstpointer b)
{
  const RankTensor *x = a, *y = b;

  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

GPtrArray *
rank_files_new(WsyncPlan *plan, WsyncLayout *layout)
{
  GPtrArray *files = g_ptr_array_new_with_free_func(rank_file_free);
  guint n_files = 0;

  for (guint i = 0; i < layout->tensors->len; i++)
    n_files = MAX(n_files, ((WsyncLayoutTensor *)layout->tensors->pdata[i])->part + 1);
  for (guint p = 0; p < n_files; p++) {
    g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
    RankFile *f = g_new0(RankFile, 1);
    GHashTableIter it;
    gpointer k, v;

    f->rank = layout->rank;
    f->part = p;
    f->name = plan_file_name(plan, layout, p);
    f->tensors = g_array_new(FALSE, FALSE, sizeof(RankTensor));
    wsync_safetensors_writer_set_metadata(w, "format", "pt");
    g_hash_table_iter_init(&it, layout->metadata);
    while (g_hash_table_iter_next(&it, &k, &v))
      wsync_safetensors_writer_set_metadata(w, k, v);
    for (guint i = 0; i < layout->tensors->len; i++) {
      WsyncLayoutTensor *lt = layout->tensors->pdata[i];
      if (lt->part != p)
        continue;
      /* the plan named and sized it: the writer cannot refuse it */
      gboolean ok = wsync_safetensors_writer_add(w, lt->name, lt->dtype, lt->ndim, lt->shape,
                                                 NULL);
      g_assert(ok);
    }
    f->header = wsync_safetensors_writer_header(w, &f->header_len);
    f->size = f->header_len + wsync_safetensors_writer_data_size(w);
    for (guint i = 0; i < layout->tensors->len; i++) {
      WsyncLayoutTensor *lt = layout->tensors->pdata[i];
      if (lt->part != p)
        continue;
      RankTensor t = {lt, f->header_len + wsync_safetensors_writer_tensor_offset(w, lt->name)};
      g_array_append_val(f->tensors, t);
    }
    g_array_sort(f->tensors, compare_offsets);
    g_ptr_array_add(files, f);
  }
  return files;
}

guint8 *
rank_file_map_new(int fd, const char *path, const guint8 *header, gsize header_len,
                  guint64 size, GError **error)
{
  const guint8 *p = header;
  gsize left = header_len;
  int rc;

  while (left > 0) {
    ssize_t k = pwrite(fd, p, left, (off_t)(header_len - left));
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      wsync_set_io_error(error, k < 0 ? errno : ENOSPC, path, "write");
      return NULL;
    }
    p += k;
    left -= (gsize)k;
  }
  if (size > (guint64)G_MAXINT64 || ftruncate(fd, (off_t)size) != 0) {
    wsync_set_io_error(error, size > (guint64)G_MAXINT64 ? EFBIG : errno, path, "resize");
    return NULL;
  }
  /* reserve the blocks: writing through a map into a sparse file on a full disk would
   * kill the process with SIGBUS instead of failing here */
  rc = posix_fallocate(fd, 0, (off_t)size);
  if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
    wsync_set_io_error(error, rc, path, "reserve space for");
    return NULL;
  }
  void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    wsync_set_io_error(error, errno, path, "map");
    return NULL;
  }
  return map;
}
