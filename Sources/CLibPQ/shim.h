#ifndef METRICSD_CLIBPQ_SHIM_H
#define METRICSD_CLIBPQ_SHIM_H
#include <libpq-fe.h>
#include <sys/select.h>
#endif
