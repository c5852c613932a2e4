/* wsync sync: the distributed sync lives in its own program, wsync-mpi, the only one that
 * links MPI (a `wsync` without MPI stays installable everywhere; the wsync-mpi package
 * adds it).  `wsync sync ARGS` runs wsync-mpi with the same ARGS, as git runs its
 * subcommands, so `mpirun -np N wsync sync SRC DST ...` works: every process execs
 * wsync-mpi before anything calls MPI_Init (mpirun's environment goes with it). */
#include "config.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define MPI_PROGRAM "wsync-mpi"

/* Where wsync-mpi is: $WSYNC_LIBEXECDIR when set (and then only there: the tests point it
 * at the build tree, or at a directory without it); else beside the running wsync (a
 * build tree: libtool runs the real wsync from .libs/, so its parent too); else the
 * installed $(libexecdir)/wsync. */
static char *
find_mpi_program(char **looked_in)
{
  const char *env = g_getenv("WSYNC_LIBEXECDIR");
  g_autoptr(GPtrArray) dirs = g_ptr_array_new_with_free_func(g_free);

  if (env != NULL && env[0] != '\0')
    g_ptr_array_add(dirs, g_strdup(env));
  else {
    g_autofree char *self = g_file_read_link("/proc/self/exe", NULL);
    if (self != NULL) {
      char *dir = g_path_get_dirname(self);
      g_ptr_array_add(dirs, dir);
      g_autofree char *base = g_path_get_basename(dir);
      if (strcmp(base, ".libs") == 0)
        g_ptr_array_add(dirs, g_path_get_dirname(dir));
    }
    g_ptr_array_add(dirs, g_strdup(WSYNC_LIBEXEC_DIR));
  }
  for (guint i = 0; i < dirs->len; i++) {
    char *path = g_build_filename(dirs->pdata[i], MPI_PROGRAM, NULL);
    if (g_file_test(path, G_FILE_TEST_IS_REGULAR))
      return path;
    g_free(path);
  }
  g_ptr_array_add(dirs, NULL);
  *looked_in = g_strjoinv(", ", (char **)dirs->pdata);
  return NULL;
}

int
cmd_sync(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  g_autofree char *looked_in = NULL;
  g_autofree char *program = find_mpi_program(&looked_in);

  (void)cli;
  (void)cmd;
  if (program == NULL) {
    cli_error_line("wsync sync: the distributed sync is not installed (no " MPI_PROGRAM " in "
                   "%s): install the wsync-mpi package, or build wsync with MPI "
                   "(./configure --with-mpi)",
                   looked_in);
    return WSYNC_EXIT_USAGE;
  }
  /* argv without the command's name: "wsync sync", then the arguments as given */
  g_autofree char **args = g_new0(char *, argc + 1);
  args[0] = program;
  for (int i = 1; i < argc; i++)
    args[i] = argv[i];
  execv(program, args);
  cli_error_line("wsync sync: cannot run %s: %s", program, g_strerror(errno));
  return WSYNC_EXIT_USAGE;
}
