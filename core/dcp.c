/* Placeholder until the DCP readers land: nothing is detected as sharded. */
#include <wsync/error.h>

#include "dcp.h"

gboolean wsync_dcp_detect(const char *dir) { (void)dir; return FALSE; }
WsyncDcp *wsync_dcp_open(const char *dir, GError **error)
{
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "%s: sharded checkpoints are not supported yet", dir);
  return NULL;
}
guint wsync_dcp_n_tensors(const WsyncDcp *dcp) { (void)dcp; return 0; }
const WsyncDcpTensor *wsync_dcp_tensor(const WsyncDcp *dcp, guint i) { (void)dcp; (void)i; return NULL; }
gboolean wsync_dcp_check_coverage(const WsyncDcp *dcp, GError **error) { (void)dcp; (void)error; return TRUE; }
void wsync_dcp_free(WsyncDcp *dcp) { (void)dcp; }
