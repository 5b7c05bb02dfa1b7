/*
 * doca_error.h - the header urom's C plugins and hosts share; it lives in plugins/include.
 *
 * A host compiles with -I urom-capi/include alone: this file brings in the one definition.
 */
#include "../../plugins/include/doca_error.h"
