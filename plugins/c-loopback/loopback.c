/*
 * A loopback plugin in C, written against urom_plugin.h the way DOCA UROM plugins are: each
 * 16-byte command {type, data} comes back as a 16-byte notification with the same data.
 *
 * Build: cc -std=c11 -shared -fPIC -I plugins/include -o worker_c_loopback.so \
 *            plugins/c-loopback/loopback.c
 *
 * Compile-time knobs make the broken variants the loader tests need:
 *   -DOMIT_GET_IFACE       export the interface under a misspelled name only
 *   -DIFACE_VERSION=n      report interface version word n
 *   -DGET_VERSION_FAILS    urom_plugin_get_version returns an error
 *   -DOPEN_FAILS           open returns an error
 *   -DREJECT_COMMANDS      worker_cmd refuses every command with DOCA_ERROR_NOT_SUPPORTED
 *   -DCRASH_ON_LOAD        crash (SIGSEGV) as soon as the library is loaded
 *   -DHANG_ON_LOAD         never return from loading the library
 *   -DCHATTY_ON_LOAD       write 1 MiB to standard output and 1 MiB to standard error while the
 *                          library is loaded, then load fine
 */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "urom_plugin.h"

#ifdef CRASH_ON_LOAD
__attribute__((constructor)) static void crash_on_load(void)
{
	/* The default action, whatever handler the loading process installed. */
	signal(SIGSEGV, SIG_DFL);
	raise(SIGSEGV);
}
#endif

#ifdef HANG_ON_LOAD
__attribute__((constructor)) static void hang_on_load(void)
{
	for (;;)
		pause();
}
#endif

#ifdef CHATTY_ON_LOAD
static void chatter(int fd)
{
	char line[64];
	size_t left = 1 << 20;

	memset(line, 'x', sizeof(line));
	line[sizeof(line) - 1] = '\n';
	while (left > 0) {
		size_t len = left < sizeof(line) ? left : sizeof(line);
		ssize_t n = write(fd, line, len);

		if (n <= 0)
			return;
		left -= (size_t)n;
	}
}

__attribute__((constructor)) static void chatty_on_load(void)
{
	chatter(STDOUT_FILENO);
	chatter(STDERR_FILENO);
}
#endif

#define LOOPBACK_VERSION 0x01
#define LOOPBACK_ADDR "c-loopback-endpoint"

struct loopback_cmd {
	uint64_t type;
	uint64_t data;
};

struct loopback_state {
	ucs_list_link_t completed;
	uint64_t commands;
};

static doca_error_t loopback_open(struct urom_worker_ctx *ctx)
{
#ifdef OPEN_FAILS
	(void)ctx;
	return DOCA_ERROR_INITIALIZATION;
#else
	struct loopback_state *state = calloc(1, sizeof(*state));

	if (state == NULL)
		return DOCA_ERROR_NO_MEMORY;
	ucs_list_head_init(&state->completed);
	ctx->plugin_ctx = state;
	return DOCA_SUCCESS;
#endif
}

static void loopback_close(struct urom_worker_ctx *ctx)
{
	struct loopback_state *state = ctx->plugin_ctx;

	while (!ucs_list_is_empty(&state->completed))
		free(ucs_list_extract_head(&state->completed, struct urom_worker_notif_desc, entry));
	free(state);
}

static doca_error_t loopback_addr(struct urom_worker_ctx *ctx, void *addr, uint64_t *addr_len)
{
	(void)ctx;
	if (*addr_len < sizeof(LOOPBACK_ADDR)) {
		*addr_len = sizeof(LOOPBACK_ADDR);
		return DOCA_ERROR_INVALID_VALUE;
	}
	*addr_len = sizeof(LOOPBACK_ADDR);
	memcpy(addr, LOOPBACK_ADDR, sizeof(LOOPBACK_ADDR));
	return DOCA_SUCCESS;
}

static doca_error_t loopback_worker_cmd(struct urom_worker_ctx *ctx, ucs_list_link_t *cmd_list)
{
	struct loopback_state *state = ctx->plugin_ctx;

#ifdef REJECT_COMMANDS
	(void)state;
	(void)cmd_list;
	return DOCA_ERROR_NOT_SUPPORTED;
#endif
	while (!ucs_list_is_empty(cmd_list)) {
		struct urom_worker_cmd_desc *cmd_desc =
			ucs_list_extract_head(cmd_list, struct urom_worker_cmd_desc, entry);
		struct urom_worker_cmd *cmd = &cmd_desc->worker_cmd;
		struct urom_worker_notif_desc *nd;
		doca_error_t status = DOCA_SUCCESS;
		uint64_t len = sizeof(struct loopback_cmd);

		if (cmd->len != sizeof(struct loopback_cmd)) {
			status = DOCA_ERROR_INVALID_VALUE;
			len = 0;
		}
		nd = calloc(1, sizeof(*nd) + len);
		if (nd == NULL) {
			free(cmd_desc);
			return DOCA_ERROR_NO_MEMORY;
		}
		nd->dest_id = cmd_desc->dest_id;
		nd->worker_notif.type = cmd->type;
		nd->worker_notif.urom_context = cmd->urom_context;
		nd->worker_notif.len = len;
		nd->worker_notif.status = status;
		memcpy(nd->worker_notif.plugin_notif, cmd->plugin_cmd, len);
		ucs_list_add_tail(&state->completed, &nd->entry);
		state->commands++;
		free(cmd_desc);
	}
	return DOCA_SUCCESS;
}

static doca_error_t loopback_progress(struct urom_worker_ctx *ctx, ucs_list_link_t *notif_list)
{
	struct loopback_state *state = ctx->plugin_ctx;

	if (ucs_list_is_empty(&state->completed))
		return DOCA_ERROR_EMPTY;
	while (!ucs_list_is_empty(&state->completed)) {
		struct urom_worker_notif_desc *nd =
			ucs_list_extract_head(&state->completed, struct urom_worker_notif_desc, entry);
		ucs_list_add_tail(notif_list, &nd->entry);
	}
	return DOCA_SUCCESS;
}

static doca_error_t loopback_notif_pack(struct urom_worker_notify *notif, size_t *packed_notif_len,
					void *packed_notif)
{
	size_t len = sizeof(*notif) + notif->len;

	if (*packed_notif_len < len) {
		*packed_notif_len = len;
		return DOCA_ERROR_INVALID_VALUE;
	}
	memcpy(packed_notif, notif, len);
	*packed_notif_len = len;
	return DOCA_SUCCESS;
}

static struct urom_plugin_iface loopback_iface = {
	.open = loopback_open,
	.close = loopback_close,
	.addr = loopback_addr,
	.worker_cmd = loopback_worker_cmd,
	.progress = loopback_progress,
	.notif_pack = loopback_notif_pack,
};

doca_error_t urom_plugin_get_version(uint64_t *version)
{
#ifdef GET_VERSION_FAILS
	(void)version;
	return DOCA_ERROR_NOT_SUPPORTED;
#else
	*version = LOOPBACK_VERSION;
	return DOCA_SUCCESS;
#endif
}

#ifdef OMIT_GET_IFACE
#define GET_IFACE urom_plugin_get_interface
doca_error_t GET_IFACE(struct urom_plugin_iface *iface);
#else
#define GET_IFACE urom_plugin_get_iface
#endif

doca_error_t GET_IFACE(struct urom_plugin_iface *iface)
{
	if (iface == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	DOCA_STRUCT_CTOR(loopback_iface);
#ifdef IFACE_VERSION
	loopback_iface.__doca_api_version = IFACE_VERSION;
#endif
	*iface = loopback_iface;
	return DOCA_SUCCESS;
}
