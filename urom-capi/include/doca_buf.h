/*
 * doca_buf.h - buffers: `len` bytes at `head` and, inside them, the data (doca_buf_get_data(),
 * doca_buf_get_data_len()). A UROM command task's payload and response are buffers its task
 * owns; buffers from an inventory (doca_buf_inventory.h) go back to it when their last
 * reference is dropped, with the whole list they head.
 *
 * doca_buf_set_data() and doca_buf_set_data_len() refuse data outside the buffer
 * (DOCA_ERROR_INVALID_VALUE); doca_buf_dec_refcount() refuses a task's buffers and buffers that
 * do not head their list (DOCA_ERROR_NOT_PERMITTED).
 */
#ifndef DOCA_BUF_H_
#define DOCA_BUF_H_

#include <stddef.h>
#include <stdint.h>

#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct doca_buf;

DOCA_STABLE
doca_error_t doca_buf_get_head(const struct doca_buf *buf, void **head);

DOCA_STABLE
doca_error_t doca_buf_get_len(const struct doca_buf *buf, size_t *len);

DOCA_STABLE
doca_error_t doca_buf_get_data(const struct doca_buf *buf, void **data);

DOCA_STABLE
doca_error_t doca_buf_get_data_len(const struct doca_buf *buf, size_t *data_len);

DOCA_STABLE
doca_error_t doca_buf_set_data(struct doca_buf *buf, void *data, size_t data_len);

DOCA_STABLE
doca_error_t doca_buf_set_data_len(struct doca_buf *buf, size_t data_len);

DOCA_STABLE
doca_error_t doca_buf_reset_data_len(struct doca_buf *buf);

DOCA_STABLE
doca_error_t doca_buf_get_refcount(const struct doca_buf *buf, uint16_t *refcount);

DOCA_STABLE
doca_error_t doca_buf_inc_refcount(struct doca_buf *buf, uint16_t *refcount);

DOCA_STABLE
doca_error_t doca_buf_dec_refcount(struct doca_buf *buf, uint16_t *refcount);

/* Appends the list list2 heads to the list list1 heads. */
DOCA_STABLE
doca_error_t doca_buf_chain_list(struct doca_buf *list1, struct doca_buf *list2);

/* The next buffer of the list, NULL at its end. */
DOCA_STABLE
doca_error_t doca_buf_get_next_in_list(struct doca_buf *buf, struct doca_buf **next_buf);

DOCA_STABLE
doca_error_t doca_buf_get_last_in_list(struct doca_buf *buf, struct doca_buf **last_buf);

DOCA_STABLE
doca_error_t doca_buf_get_list_len(const struct doca_buf *buf, uint32_t *num_elements);

#ifdef __cplusplus
}
#endif

#endif /* DOCA_BUF_H_ */
