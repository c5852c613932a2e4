/* wsync: umbrella header.  Out-of-tree plugins include this (pkg-config wsync). */
#ifndef WSYNC_H
#define WSYNC_H

#include <wsync/api.h>
#include <wsync/checkpoint.h>
#include <wsync/command.h>
#include <wsync/dtype.h>
#include <wsync/env.h>
#include <wsync/error.h>
#include <wsync/layout.h>
#include <wsync/model.h>
#include <wsync/plan.h>
#include <wsync/plugin.h>
#include <wsync/registry.h>
#include <wsync/safetensors.h>
#include <wsync/session.h>
#include <wsync/target.h>

#endif /* WSYNC_H */
