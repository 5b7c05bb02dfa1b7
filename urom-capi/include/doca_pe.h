/*
 * doca_pe.h - progress engines and tasks.
 *
 * A progress engine polls the contexts connected to it: doca_pe_progress() completes tasks,
 * runs their callbacks and the contexts' state-changed callbacks, and returns 1 when anything
 * happened. One engine per thread; a callback must not call doca_pe_progress() on its own engine
 * (such a call does nothing and returns 0).
 *
 * Notifications, to sleep until there is work instead of polling:
 *
 *	doca_pe_get_notification_handle(pe, &fd);    (once: the same descriptor every time)
 *	for (;;) {
 *		doca_pe_request_notification(pe);
 *		epoll_wait(...);                      (fd, alone or in the program's epoll set)
 *		doca_pe_clear_notification(pe, fd);
 *		while (doca_pe_progress(pe))
 *			;
 *	}
 *
 * The descriptor (an epoll descriptor, to be read only through these calls) becomes readable
 * after a request when a task of a connected context may have completed or a context may change
 * state, at once when that is so already. Contexts that cannot wake a sleeper (a worker or
 * domain still starting, a worker stopping while the daemon answers, workers-by-gid queries in
 * flight) make it readable again after 1 ms. Wake-ups may be spurious: progress, then request
 * again.
 */
#ifndef DOCA_PE_H_
#define DOCA_PE_H_

#include <stdint.h>
#include <stdlib.h>

#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct doca_ctx;
struct doca_pe;
struct doca_task;

/* A task's completion callback. */
typedef void (*doca_task_completion_cb_t)(struct doca_task *task,
					  union doca_data task_user_data,
					  union doca_data ctx_user_data);

DOCA_STABLE
doca_error_t doca_pe_create(struct doca_pe **pe);

/* DOCA_ERROR_IN_USE while contexts are connected: destroy them first. */
DOCA_STABLE
doca_error_t doca_pe_destroy(struct doca_pe *pe);

DOCA_STABLE
uint8_t doca_pe_progress(struct doca_pe *pe);

/* The descriptor to wait on (see above); made on the first call, closed by doca_pe_destroy(). */
DOCA_STABLE
doca_error_t doca_pe_get_notification_handle(const struct doca_pe *pe, doca_notification_handle_t *handle);

/* Ends a wait: the descriptor is quiet again; progress next. `handle` is ignored. */
DOCA_STABLE
doca_error_t doca_pe_clear_notification(struct doca_pe *pe, doca_notification_handle_t handle);

/* Arms the engine: the descriptor becomes readable when there may be work (see above). */
DOCA_STABLE
doca_error_t doca_pe_request_notification(struct doca_pe *pe);

DOCA_STABLE
doca_error_t doca_pe_get_num_inflight_tasks(const struct doca_pe *pe, size_t *num_inflight_tasks);

/* Submits a task of a running context (DOCA_ERROR_BAD_STATE otherwise); its callback runs from
 * doca_pe_progress(). */
DOCA_STABLE
doca_error_t doca_task_submit(struct doca_task *task);

DOCA_STABLE
doca_error_t doca_task_try_submit(struct doca_task *task);

/* Gives a task that is not in flight back to its context. */
DOCA_STABLE
void doca_task_free(struct doca_task *task);

/* DOCA_SUCCESS, or why the task failed. */
DOCA_STABLE
doca_error_t doca_task_get_status(const struct doca_task *task);

DOCA_STABLE
void doca_task_set_user_data(struct doca_task *task, union doca_data user_data);

DOCA_STABLE
union doca_data doca_task_get_user_data(const struct doca_task *task);

DOCA_STABLE
struct doca_ctx *doca_task_get_ctx(const struct doca_task *task);

/* Connects an idle context (DOCA_ERROR_BAD_STATE otherwise) to the engine; a context connects
 * once (DOCA_ERROR_NOT_PERMITTED after) and is disconnected when destroyed. */
DOCA_STABLE
doca_error_t doca_pe_connect_ctx(struct doca_pe *pe, struct doca_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif /* DOCA_PE_H_ */
