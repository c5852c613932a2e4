/* The baseline of `wsync sync`'s benchmark (tests/bench.sh): a bare MPI_Bcast of a
 * checkpoint's bytes from process 0 to every process, in buckets of the size wsync sync
 * uses, as today's weight-sync systems ship weights (every byte to every rank, each rank
 * keeping its slice).  Process 0 broadcasts straight from the files' memory maps; the
 * others receive into one reused buffer and keep nothing, so that what is timed is the
 * transport alone.
 *
 *   mpirun -np N mpi-bcast BUCKET_BYTES FILE...
 *
 * Each process prints "mpi-bcast: process P received B bytes" at the end. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

static void
die(const char *what, const char *path)
{
  fprintf(stderr, "mpi-bcast: %s %s\n", what, path);
  MPI_Abort(MPI_COMM_WORLD, 4);
}

int
main(int argc, char **argv)
{
  int me, n;
  unsigned long long bucket, received = 0;
  char *end = NULL;

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc < 3 || (bucket = strtoull(argv[1], &end, 10)) == 0 || *end != '\0' ||
      bucket > (1ull << 30)) {
    if (me == 0)
      fprintf(stderr, "usage: mpirun -np N mpi-bcast BUCKET_BYTES FILE... (BUCKET_BYTES "
                      "from 1 to 2^30: an MPI count is an int)\n");
    MPI_Finalize();
    return 2;
  }
  char *buffer = me == 0 ? NULL : malloc(bucket);
  if (me != 0 && buffer == NULL)
    die("cannot allocate a bucket of", argv[1]);
  for (int f = 2; f < argc; f++) {
    /* every process learns the file's size from process 0, which alone reads it */
    unsigned long long size = 0;
    const char *data = NULL;
    if (me == 0) {
      struct stat st;
      int fd = open(argv[f], O_RDONLY | O_CLOEXEC);
      if (fd < 0 || fstat(fd, &st) != 0)
        die("cannot open", argv[f]);
      size = (unsigned long long)st.st_size;
      if (size > 0 && (data = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
        die("cannot map", argv[f]);
      close(fd);
    }
    MPI_Bcast(&size, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    for (unsigned long long at = 0; at < size; at += bucket) {
      int count = (int)(size - at < bucket ? size - at : bucket);
      MPI_Bcast(me == 0 ? (void *)(data + at) : buffer, count, MPI_BYTE, 0, MPI_COMM_WORLD);
      if (me != 0)
        received += (unsigned long long)count;
    }
    if (me == 0 && size > 0)
      munmap((void *)data, size);
  }
  printf("mpi-bcast: process %d received %llu bytes\n", me, received);
  free(buffer);
  MPI_Finalize();
  return 0;
}
