#ifndef METRICSD_CLIBCRYPTO_SHIM_H
#define METRICSD_CLIBCRYPTO_SHIM_H
// OpenSSL 3's libcrypto: the library libpq already loads into the process.
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/decoder.h>
#include <openssl/ecdsa.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#endif
