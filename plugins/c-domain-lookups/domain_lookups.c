/*
 * A plugin written the way DOCA UROM plugins are, against DOCA's header names only: for each
 * command it asks the worker's domain lookups about a domain member and reports what they
 * returned in the notification.
 *
 * Its address (what `addr` returns) is "domain-lookups@<pid>" with its NUL, so that a test can
 * tell the workers of a domain apart.
 *
 * Command (8 bytes): the domain id to look up.
 * Notification (56 bytes), all little-endian:
 *   int32 status[8]  addr, seg, memh, mkey lookups with valid output pointers, then the same
 *                    four with a NULL output pointer;
 *   uint32 cleared   bit i set when lookup i (of the first four) left its outputs cleared:
 *                    NULL pointers, zero lengths, segment -1;
 *   uint32 reserved  zero;
 *   uint64 api_version  the __doca_api_version word of the interface the worker handed back
 *                       in ctx->iface;
 *   uint64 commands  commands handled so far.
 *
 * Command (24 bytes): uint64 domain id, uint64 va, int32 seg, uint32 zero: what the lookups
 * found for that member, virtual address and segment.
 * Notification (160 bytes), all little-endian:
 *   int32 status[4]  addr, seg, memh, mkey lookups;
 *   int32 seg        what seg_lookup stored for va;
 *   uint32 memh_len  what memh_lookup stored for seg;
 *   uint32 mkey_len  what mkey_lookup stored for seg;
 *   uint32 addr_len  the length of the address addr_lookup returned, up to its first NUL;
 *   char addr[64]    that address, NUL-padded (cut at 63 bytes);
 *   uint8 memh[32]   the first bytes of the memory handle, zero-padded;
 *   uint8 mkey[32]   the first bytes of the remote key, zero-padded.
 *
 * A command of another length gets an empty notification with DOCA_ERROR_INVALID_VALUE.
 *
 * Build: cc -std=c11 -shared -fPIC -I plugins/include -o worker_domain_lookups.so \
 *            plugins/c-domain-lookups/domain_lookups.c
 *
 *   -DIFACE_WORD=n  store n as the interface version word instead of what DOCA_STRUCT_CTOR
 *                   stores, as a plugin built with another SDK's headers would
 */
#define _POSIX_C_SOURCE 200809L

#include <doca_error.h>
#include <doca_urom_plugin.h>
#include <doca_compat.h>
#include <doca_log.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

DOCA_LOG_REGISTER(UROM::WORKER::DOMAIN_LOOKUPS);

#define LOOKUPS_VERSION 0x01
#define LOOKUPS_ADDR_MAX 64

struct lookups_notif {
	int32_t status[8];
	uint32_t cleared;
	uint32_t reserved;
	uint64_t api_version;
	uint64_t commands;
};

struct lookups_detail {
	int32_t status[4];
	int32_t seg;
	uint32_t memh_len;
	uint32_t mkey_len;
	uint32_t addr_len;
	char addr[64];
	uint8_t memh[32];
	uint8_t mkey[32];
};

struct lookups_worker {
	ucs_list_link_t completed;
	uint64_t commands;
	char addr[LOOKUPS_ADDR_MAX];
	size_t addr_len;
};

static doca_error_t lookups_open(struct urom_worker_ctx *ctx)
{
	struct lookups_worker *worker = malloc(sizeof(*worker));

	if (worker == NULL)
		return DOCA_ERROR_NO_MEMORY;
	ucs_list_head_init(&worker->completed);
	worker->commands = 0;
	snprintf(worker->addr, sizeof(worker->addr), "domain-lookups@%ld", (long)getpid());
	worker->addr_len = strlen(worker->addr) + 1;
	ctx->plugin_ctx = worker;
	DOCA_LOG_DBG("opened, interface version word %#zx", ctx->iface.__doca_api_version);
	return DOCA_SUCCESS;
}

static void lookups_close(struct urom_worker_ctx *ctx)
{
	struct lookups_worker *worker = ctx->plugin_ctx;

	if (worker == NULL)
		return;
	while (!ucs_list_is_empty(&worker->completed))
		free(ucs_list_extract_head(&worker->completed, struct urom_worker_notif_desc, entry));
	free(worker);
}

static doca_error_t lookups_addr(struct urom_worker_ctx *ctx, void *addr, uint64_t *addr_len)
{
	struct lookups_worker *worker = ctx->plugin_ctx;

	if (*addr_len < worker->addr_len) {
		*addr_len = worker->addr_len;
		return DOCA_ERROR_INVALID_VALUE;
	}
	*addr_len = worker->addr_len;
	memcpy(addr, worker->addr, worker->addr_len);
	return DOCA_SUCCESS;
}

/* What the lookups found for member `id`, address `va` and segment `seg`. */
static void lookup_detail(struct urom_worker_ctx *ctx, uint64_t id, uint64_t va, int seg,
			  struct lookups_detail *out)
{
	void *addr = NULL;
	void *memh = NULL;
	void *rkey = NULL;
	size_t memh_len = 0;
	size_t rkey_len = 0;
	int found_seg = 99;

	out->status[0] = doca_urom_worker_domain_addr_lookup(ctx, id, &addr);
	if (out->status[0] == DOCA_SUCCESS && addr != NULL) {
		size_t len = strnlen(addr, sizeof(out->addr) - 1);

		memcpy(out->addr, addr, len);
		out->addr_len = (uint32_t)len;
	}
	out->status[1] = doca_urom_worker_domain_seg_lookup(ctx, id, va, &found_seg);
	out->seg = found_seg;
	out->status[2] = doca_urom_worker_domain_memh_lookup(ctx, id, seg, &memh_len, &memh);
	out->memh_len = (uint32_t)memh_len;
	if (out->status[2] == DOCA_SUCCESS && memh != NULL)
		memcpy(out->memh, memh, memh_len < sizeof(out->memh) ? memh_len : sizeof(out->memh));
	out->status[3] = doca_urom_worker_domain_mkey_lookup(ctx, id, seg, &rkey_len, &rkey);
	out->mkey_len = (uint32_t)rkey_len;
	if (out->status[3] == DOCA_SUCCESS && rkey != NULL)
		memcpy(out->mkey, rkey, rkey_len < sizeof(out->mkey) ? rkey_len : sizeof(out->mkey));
}

/* Asks every lookup about domain member `id`. */
static void lookup_all(struct urom_worker_ctx *ctx, uint64_t id, struct lookups_notif *out)
{
	void *addr = &addr;
	void *memh = &memh;
	void *rkey = &rkey;
	size_t memh_len = 99;
	size_t rkey_len = 99;
	int seg = 99;
	doca_error_t status;

	status = doca_urom_worker_domain_addr_lookup(ctx, id, &addr);
	out->status[0] = status;
	out->cleared |= addr == NULL ? 1u << 0 : 0;

	status = doca_urom_worker_domain_seg_lookup(ctx, id, (uint64_t)(uintptr_t)out, &seg);
	out->status[1] = status;
	out->cleared |= seg == -1 ? 1u << 1 : 0;

	status = doca_urom_worker_domain_memh_lookup(ctx, id, 0, &memh_len, &memh);
	out->status[2] = status;
	out->cleared |= memh == NULL && memh_len == 0 ? 1u << 2 : 0;

	status = doca_urom_worker_domain_mkey_lookup(ctx, id, 0, &rkey_len, &rkey);
	out->status[3] = status;
	out->cleared |= rkey == NULL && rkey_len == 0 ? 1u << 3 : 0;

	out->status[4] = doca_urom_worker_domain_addr_lookup(ctx, id, NULL);
	out->status[5] = doca_urom_worker_domain_seg_lookup(ctx, id, 0, NULL);
	out->status[6] = doca_urom_worker_domain_memh_lookup(ctx, id, 0, &memh_len, NULL);
	out->status[7] = doca_urom_worker_domain_mkey_lookup(ctx, id, 0, NULL, &rkey);

	if (out->status[0] != DOCA_SUCCESS)
		DOCA_LOG_INFO("domain member %lu: %s (%s)", (unsigned long)id,
			      doca_error_get_name((doca_error_t)out->status[0]),
			      doca_error_get_descr((doca_error_t)out->status[0]));
}

static doca_error_t lookups_worker_cmd(struct urom_worker_ctx *ctx, ucs_list_link_t *cmd_list)
{
	struct lookups_worker *worker = ctx->plugin_ctx;

	while (!ucs_list_is_empty(cmd_list)) {
		struct urom_worker_cmd_desc *cmd_desc =
			ucs_list_extract_head(cmd_list, struct urom_worker_cmd_desc, entry);
		struct urom_worker_cmd *cmd = &cmd_desc->worker_cmd;
		struct urom_worker_notif_desc *nd;
		struct lookups_notif result;
		struct lookups_detail detail;
		uint64_t id;

		nd = calloc(1, sizeof(*nd) + sizeof(detail));
		if (nd == NULL) {
			free(cmd_desc);
			return DOCA_ERROR_NO_MEMORY;
		}
		nd->dest_id = cmd_desc->dest_id;
		nd->worker_notif.type = cmd->type;
		nd->worker_notif.urom_context = cmd->urom_context;
		if (cmd->len == 24) {
			uint64_t va;
			int32_t seg;

			memcpy(&id, cmd->plugin_cmd, sizeof(id));
			memcpy(&va, cmd->plugin_cmd + 8, sizeof(va));
			memcpy(&seg, cmd->plugin_cmd + 16, sizeof(seg));
			memset(&detail, 0, sizeof(detail));
			lookup_detail(ctx, id, va, seg, &detail);
			worker->commands++;
			nd->worker_notif.status = DOCA_SUCCESS;
			nd->worker_notif.len = sizeof(detail);
			memcpy(nd->worker_notif.plugin_notif, &detail, sizeof(detail));
		} else if (cmd->len != sizeof(id)) {
			DOCA_LOG_ERR("command of %lu bytes, expected %zu", (unsigned long)cmd->len, sizeof(id));
			nd->worker_notif.status = DOCA_ERROR_INVALID_VALUE;
			nd->worker_notif.len = 0;
		} else {
			memcpy(&id, cmd->plugin_cmd, sizeof(id));
			memset(&result, 0, sizeof(result));
			lookup_all(ctx, id, &result);
			result.api_version = DOCA_STRUCT_GET_VERSION(&ctx->iface);
			result.commands = ++worker->commands;
			nd->worker_notif.status = DOCA_SUCCESS;
			nd->worker_notif.len = sizeof(result);
			memcpy(nd->worker_notif.plugin_notif, &result, sizeof(result));
		}
		ucs_list_add_tail(&worker->completed, &nd->entry);
		free(cmd_desc);
	}
	return DOCA_SUCCESS;
}

static doca_error_t lookups_progress(struct urom_worker_ctx *ctx, ucs_list_link_t *notif_list)
{
	struct lookups_worker *worker = ctx->plugin_ctx;

	if (ucs_list_is_empty(&worker->completed))
		return DOCA_ERROR_EMPTY;
	while (!ucs_list_is_empty(&worker->completed)) {
		struct urom_worker_notif_desc *nd =
			ucs_list_extract_head(&worker->completed, struct urom_worker_notif_desc, entry);

		ucs_list_add_tail(notif_list, &nd->entry);
	}
	return DOCA_SUCCESS;
}

static doca_error_t lookups_notif_pack(struct urom_worker_notify *notif, size_t *packed_notif_len,
				       void *packed_notif)
{
	size_t len = ucs_offsetof(struct urom_worker_notify, plugin_notif) + notif->len;

	if (*packed_notif_len < len) {
		*packed_notif_len = len;
		return DOCA_ERROR_INVALID_VALUE;
	}
	memcpy(packed_notif, notif, len);
	*packed_notif_len = len;
	return DOCA_SUCCESS;
}

/* Interface, as DOCA plugins declare it: a struct of their own around the DOCA one. */
struct urom_worker_lookups_iface {
	struct urom_plugin_iface super;
};

static struct urom_worker_lookups_iface lookups_iface = {
	.super.open = lookups_open,
	.super.close = lookups_close,
	.super.addr = lookups_addr,
	.super.worker_cmd = lookups_worker_cmd,
	.super.progress = lookups_progress,
	.super.notif_pack = lookups_notif_pack,
};

doca_error_t urom_plugin_get_iface(struct urom_plugin_iface *iface)
{
	if (iface == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	DOCA_STRUCT_CTOR(lookups_iface.super);
#ifdef IFACE_WORD
	lookups_iface.super.__doca_api_version = IFACE_WORD;
#endif
	*iface = lookups_iface.super;
	return DOCA_SUCCESS;
}

doca_error_t urom_plugin_get_version(uint64_t *version)
{
	if (version == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*version = LOOKUPS_VERSION;
	return DOCA_SUCCESS;
}
