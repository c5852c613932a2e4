/* wsync: PyTorch Distributed Checkpoint readers (placeholder API; see helper-8). */
#ifndef WSYNC_DCP_H
#define WSYNC_DCP_H

#include <wsync/engine.h>

typedef struct {
  WsyncBox box;
  const guint8 *data;
  WsyncRegion region;
  const char *file;
} WsyncDcpChunk;

typedef struct {
  char *name;
  WsyncDtype dtype;
  guint ndim;
  guint64 shape[WSYNC_MAX_DIMS];
  GArray *chunks; /* WsyncDcpChunk */
  guint part;
  guint n_parts;
} WsyncDcpTensor;

typedef struct _WsyncDcp WsyncDcp;

gboolean wsync_dcp_detect(const char *dir);
WsyncDcp *wsync_dcp_open(const char *dir, GError **error);
guint wsync_dcp_n_tensors(const WsyncDcp *dcp);
const WsyncDcpTensor *wsync_dcp_tensor(const WsyncDcp *dcp, guint i);
gboolean wsync_dcp_check_coverage(const WsyncDcp *dcp, GError **error);
void wsync_dcp_free(WsyncDcp *dcp);

#endif /* WSYNC_DCP_H */
