/* wsync: the error domain and its exit codes. */
#include <string.h>

#include <wsync/error.h>

G_DEFINE_QUARK(wsync-error-quark, wsync_error)

int
wsync_error_exit_code(const GError *error)
{
  if (error == NULL)
    return WSYNC_EXIT_OK;
  if (error->domain != WSYNC_ERROR)
    return WSYNC_EXIT_IO;
  switch ((WsyncError)error->code) {
  case WSYNC_ERROR_DIFFERENT:
    return WSYNC_EXIT_DIFFERENT;
  case WSYNC_ERROR_USAGE:
  case WSYNC_ERROR_CONFIG:
  case WSYNC_ERROR_PLUGIN:
    return WSYNC_EXIT_USAGE;
  case WSYNC_ERROR_BAD_INPUT:
    return WSYNC_EXIT_BAD_INPUT;
  case WSYNC_ERROR_IO:
  case WSYNC_ERROR_FAILED:
  default:
    return WSYNC_EXIT_IO;
  }
}

void
wsync_set_io_error(GError **error, int errsv, const char *path, const char *what)
{
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "cannot %s %s: %s", what, path,
              g_strerror(errsv));
}
