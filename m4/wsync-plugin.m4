# WSYNC_PLUGIN(NAME, DEFAULT, DESCRIPTION, [PKG-CONFIG-MODULES])
# ---------------------------------------------------------------
# One switch per in-tree plugin, after collectd's AC_PLUGIN:
#   --enable-plugin-NAME / --disable-plugin-NAME
# DEFAULT is "yes" or "no".  When the plugin is wanted and PKG-CONFIG-MODULES are
# missing, configure fails if the user asked for the plugin explicitly and only
# disables it (with a notice) if it was merely on by default.
# Defines the automake conditional BUILD_PLUGIN_<NAME> (dashes become underscores,
# upper case) and substitutes <NAME>_PLUGIN_CFLAGS / _LIBS for the dependencies.
AC_DEFUN([WSYNC_PLUGIN], [
  m4_pushdef([wsync_var], m4_translit([$1], [-a-z], [_A-Z]))
  AC_ARG_ENABLE([plugin-$1],
    [AS_HELP_STRING([--enable-plugin-$1 / --disable-plugin-$1], [$3 (default: $2)])],
    [wsync_plugin_want=$enableval; wsync_plugin_explicit=yes],
    [wsync_plugin_want=$2; wsync_plugin_explicit=no])
  wsync_plugin_build=no
  AS_IF([test "x$wsync_plugin_want" = xyes], [
    m4_ifblank([$4], [wsync_plugin_build=yes], [
      PKG_CHECK_MODULES(wsync_var[_PLUGIN], [$4], [wsync_plugin_build=yes], [
        AS_IF([test "x$wsync_plugin_explicit" = xyes],
          [AC_MSG_ERROR([plugin $1 was requested (--enable-plugin-$1) but its dependencies are missing: $4. Install them or pass --disable-plugin-$1.])],
          [AC_MSG_NOTICE([plugin $1 disabled: missing $4])])
      ])
    ])
  ])
  AM_CONDITIONAL([BUILD_PLUGIN_]wsync_var, [test "x$wsync_plugin_build" = xyes])
  AS_IF([test "x$wsync_plugin_build" = xyes],
    [wsync_plugins_built="$wsync_plugins_built $1"])
  m4_popdef([wsync_var])
])
