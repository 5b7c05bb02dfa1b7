/*
 * doca_ctx.h - contexts: the state machine every DOCA library object shares.
 *
 * A context is created idle and configured; doca_ctx_start() runs it at once (DOCA_SUCCESS,
 * running) or begins to (DOCA_ERROR_IN_PROGRESS, starting: doca_pe_progress() brings it to
 * running, or back to idle if it fails); doca_ctx_stop() stops it at once or begins to
 * (DOCA_ERROR_IN_PROGRESS, stopping: progress brings it to idle). Every change of state runs the
 * state-changed callback from doca_pe_progress(). A context must be connected to a progress
 * engine before it starts (DOCA_ERROR_NOT_CONNECTED otherwise).
 *
 * Errors: DOCA_ERROR_INVALID_VALUE for NULL arguments; doca_ctx_start() on a context that is not
 * idle and doca_ctx_stop() on an idle one give DOCA_ERROR_BAD_STATE; doca_ctx_stop() on a
 * stopping context gives DOCA_ERROR_IN_PROGRESS.
 */
#ifndef DOCA_CTX_H_
#define DOCA_CTX_H_

#include <stddef.h>
#include <stdint.h>

#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct doca_ctx;

/* Context states. */
enum doca_ctx_states {
	DOCA_CTX_STATE_IDLE = 0,     /* created or stopped: configurable */
	DOCA_CTX_STATE_STARTING = 1, /* started: progress until it runs */
	DOCA_CTX_STATE_RUNNING = 2,  /* tasks may be allocated and submitted */
	DOCA_CTX_STATE_STOPPING = 3, /* stopped: progress until it is idle */
};

/* Called from doca_pe_progress() after each change of state (the context is already in
 * next_state). */
typedef void (*doca_ctx_state_changed_callback_t)(const union doca_data user_data,
						  struct doca_ctx *ctx,
						  enum doca_ctx_states prev_state,
						  enum doca_ctx_states next_state);

DOCA_STABLE
doca_error_t doca_ctx_start(struct doca_ctx *ctx);

DOCA_STABLE
doca_error_t doca_ctx_stop(struct doca_ctx *ctx);

DOCA_STABLE
doca_error_t doca_ctx_get_num_inflight_tasks(const struct doca_ctx *ctx, size_t *num_inflight_tasks);

/* The user data passed to the state-changed callback and to task callbacks. */
DOCA_STABLE
doca_error_t doca_ctx_set_user_data(struct doca_ctx *ctx, union doca_data user_data);

DOCA_STABLE
doca_error_t doca_ctx_get_user_data(const struct doca_ctx *ctx, union doca_data *user_data);

DOCA_STABLE
doca_error_t doca_ctx_set_state_changed_cb(struct doca_ctx *ctx, doca_ctx_state_changed_callback_t cb);

DOCA_STABLE
doca_error_t doca_ctx_get_state(const struct doca_ctx *ctx, enum doca_ctx_states *state);

#ifdef __cplusplus
}
#endif

#endif /* DOCA_CTX_H_ */
