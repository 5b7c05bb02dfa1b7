/*
 * urom_plugin.h - the plugin interface of urom workers, under its earlier name.
 *
 * The interface now lives in the headers with DOCA's names; include those in new code:
 *
 *   #include <doca_error.h>        status codes (doca_error_t)
 *   #include <doca_compat.h>       DOCA_STRUCT_CTOR and the symbol attributes
 *   #include <doca_urom_plugin.h>  the plugin interface and the domain lookups
 *   #include <doca_log.h>          DOCA_LOG_REGISTER, DOCA_LOG_ERR, ...
 *
 * This header includes the first three, for plugins written against it.
 */
#ifndef UROM_PLUGIN_H_
#define UROM_PLUGIN_H_

#include <doca_error.h>
#include <doca_compat.h>
#include <doca_urom_plugin.h>

#endif /* UROM_PLUGIN_H_ */
