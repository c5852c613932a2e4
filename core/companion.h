/* wsync: the files that go beside the weight files of an output directory
 * (core/companion.c): config.json through the config patchers, and the source's
 * non-weight files.  Shared by the executor (core/exec.c) and the session. */
#ifndef WSYNC_COMPANION_H
#define WSYNC_COMPANION_H

#include <json-glib/json-glib.h>
#include <wsync/registry.h>

/* Writes DIR/config.json: @config through the config patchers of @ctx; a copy of
 * @src_config, byte for byte, when it is given and no patcher changed anything. */
gboolean companion_write_config(WsyncContext *ctx, JsonNode *config, const char *src_config,
                                const char *dir, GError **error);

/* Copies every regular file of @src_dir that is not a weight file (safetensors, DCP
 * shards, the index, dot files) into @dir, config.json through the config patchers (as
 * @config, its parsed text); then writes config.json from @config when @src_dir had
 * none and @want_config is set. */
gboolean companion_copy_dir(WsyncContext *ctx, JsonNode *config, const char *src_dir,
                            const char *dir, gboolean want_config, GError **error);

#endif /* WSYNC_COMPANION_H */
