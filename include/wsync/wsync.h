/* wsync: umbrella header.  Out-of-tree plugins include this (pkg-config wsync). */
#ifndef WSYNC_H
#define WSYNC_H

#include <wsync/checkpoint.h>
#include <wsync/dtype.h>
#include <wsync/engine.h>
#include <wsync/error.h>
#include <wsync/plugin.h>
#include <wsync/registry.h>
#include <wsync/safetensors.h>

#endif /* WSYNC_H */
