/*
 * doca_mmap.h - memory maps: a memory range buffers may be taken from. urom copies command
 * payloads into its own channels, so a map only records its range, devices and permissions; it
 * registers nothing with hardware.
 *
 * Setters need a map that is not started (DOCA_ERROR_BAD_STATE); doca_mmap_start() needs a range
 * (DOCA_ERROR_BAD_STATE); doca_mmap_stop() and doca_mmap_destroy() refuse a map buffers still lie
 * in (DOCA_ERROR_IN_USE, DOCA_ERROR_NOT_PERMITTED).
 */
#ifndef DOCA_MMAP_H_
#define DOCA_MMAP_H_

#include <stddef.h>
#include <stdint.h>

#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct doca_dev;
struct doca_mmap;

DOCA_STABLE
doca_error_t doca_mmap_create(struct doca_mmap **mmap);

DOCA_STABLE
doca_error_t doca_mmap_destroy(struct doca_mmap *mmap);

DOCA_STABLE
doca_error_t doca_mmap_start(struct doca_mmap *mmap);

DOCA_STABLE
doca_error_t doca_mmap_stop(struct doca_mmap *mmap);

DOCA_STABLE
doca_error_t doca_mmap_set_memrange(struct doca_mmap *mmap, void *addr, size_t len);

DOCA_STABLE
doca_error_t doca_mmap_get_memrange(const struct doca_mmap *mmap, void **addr, size_t *len);

DOCA_STABLE
doca_error_t doca_mmap_set_permissions(struct doca_mmap *mmap, uint32_t access_mask);

DOCA_STABLE
doca_error_t doca_mmap_get_permissions(const struct doca_mmap *mmap, uint32_t *access_mask);

DOCA_STABLE
doca_error_t doca_mmap_add_dev(struct doca_mmap *mmap, struct doca_dev *dev);

DOCA_STABLE
doca_error_t doca_mmap_rm_dev(struct doca_mmap *mmap, struct doca_dev *dev);

DOCA_STABLE
doca_error_t doca_mmap_set_user_data(struct doca_mmap *mmap, union doca_data user_data);

DOCA_STABLE
doca_error_t doca_mmap_get_user_data(const struct doca_mmap *mmap, union doca_data *user_data);

#ifdef __cplusplus
}
#endif

#endif /* DOCA_MMAP_H_ */
