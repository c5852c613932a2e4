/* wsync: what marks the library's public API.
 *
 * libwsync is built with hidden visibility: only the functions declared with WSYNC_API
 * in these headers are exported (`nm -D libwsync.so` shows exactly them), so that
 * nothing private becomes an ABI by accident.
 */
#ifndef WSYNC_API_H
#define WSYNC_API_H

/** Marks a function of libwsync's public API (exported from the shared library). */
#define WSYNC_API __attribute__((visibility("default")))

#endif /* WSYNC_API_H */
