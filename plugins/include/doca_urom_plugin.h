/*
 * doca_urom_plugin.h - the plugin interface of urom workers.
 *
 * Source and binary compatible with the plugin interface of DOCA UROM (the header of the same
 * name in the DOCA SDK): a plugin written for DOCA UROM compiles against this directory
 * (`-I plugins/include`, plus UCX's headers where the plugin uses UCX) without changes, and a
 * plugin built with DOCA's own headers loads in a urom worker when its interface version word
 * is one the worker accepts (see doca_compat.h and README.md here).
 *
 * A plugin is a shared object that exports two functions:
 *
 *   doca_error_t urom_plugin_get_version(uint64_t *version);
 *   doca_error_t urom_plugin_get_iface(struct urom_plugin_iface *iface);
 *
 * urom_plugin_get_iface() stamps the interface with DOCA_STRUCT_CTOR() and copies it out.
 *
 * Ownership across the interface: the worker malloc()s every command descriptor it passes to
 * worker_cmd() and the plugin free()s it; the plugin malloc()s every notification descriptor
 * it returns from progress() and the worker free()s it.
 *
 * Lists are UCX's ucs_list_link_t. Where UCX's headers are installed this header uses
 * <ucs/datastruct/list.h>, as DOCA's does; elsewhere (or with UROM_PLUGIN_OWN_UCS_LIST
 * defined) it defines the same type and the common list operations itself.
 */
#ifndef DOCA_UROM_PLUGIN_H_
#define DOCA_UROM_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#if !defined(UCS_LIST_H_) && !defined(UROM_PLUGIN_OWN_UCS_LIST) && defined(__has_include)
#if __has_include(<ucs/datastruct/list.h>)
#include <ucs/datastruct/list.h>
#endif
#endif

#include <doca_compat.h>
#include <doca_error.h>

#ifdef __cplusplus
extern "C" {
#endif

#if !defined(UCS_LIST_H_) && !defined(UROM_UCS_LIST_)
#define UROM_UCS_LIST_
/* A link of an intrusive, circular, doubly linked list; a head points at itself when empty.
 * The same type and operations as UCX's. */
typedef struct ucs_list_link {
	struct ucs_list_link *prev;
	struct ucs_list_link *next;
} ucs_list_link_t;

#define ucs_offsetof(_type, _member) offsetof(_type, _member)

#define ucs_container_of(_ptr, _type, _member) \
	((_type *)((char *)(_ptr) - ucs_offsetof(_type, _member)))

static inline void ucs_list_head_init(ucs_list_link_t *head)
{
	head->prev = head;
	head->next = head;
}

static inline int ucs_list_is_empty(ucs_list_link_t *head)
{
	return head->next == head;
}

static inline void ucs_list_insert_after(ucs_list_link_t *pos, ucs_list_link_t *elem)
{
	elem->prev = pos;
	elem->next = pos->next;
	pos->next->prev = elem;
	pos->next = elem;
}

static inline void ucs_list_insert_before(ucs_list_link_t *pos, ucs_list_link_t *elem)
{
	ucs_list_insert_after(pos->prev, elem);
}

static inline void ucs_list_del(ucs_list_link_t *elem)
{
	elem->prev->next = elem->next;
	elem->next->prev = elem->prev;
}

static inline unsigned long ucs_list_length(ucs_list_link_t *head)
{
	unsigned long length = 0;
	ucs_list_link_t *link;

	for (link = head->next; link != head; link = link->next)
		++length;
	return length;
}

static inline ucs_list_link_t *urom_ucs_list_extract_head_link_(ucs_list_link_t *head)
{
	ucs_list_link_t *first = head->next;

	ucs_list_del(first);
	return first;
}

#define ucs_list_add_head(_head, _item) ucs_list_insert_after(_head, _item)
#define ucs_list_add_tail(_head, _item) ucs_list_insert_before(_head, _item)

/* The container of the first element of a non-empty list, removed from the list. */
#define ucs_list_extract_head(_head, _type, _member) \
	ucs_container_of(urom_ucs_list_extract_head_link_(_head), _type, _member)

/* The container of the first / last element of a non-empty list. */
#define ucs_list_head(_head, _type, _member) ucs_container_of((_head)->next, _type, _member)
#define ucs_list_tail(_head, _type, _member) ucs_container_of((_head)->prev, _type, _member)
#endif /* own list */

/* Size of a plugin name field; names hold one byte less. */
#define DOCA_UROM_PLUGIN_NAME_MAX_LEN 48

struct urom_worker_ctx;

/* What the service reports for each plugin. */
struct doca_urom_service_plugin_info {
	uint64_t id;                                     /* the id commands carry as `type` */
	uint64_t version;                                /* what urom_plugin_get_version() said */
	char plugin_name[DOCA_UROM_PLUGIN_NAME_MAX_LEN]; /* the .so file name without ".so" */
};

/* A command: header, then `len` bytes of plugin command. */
struct urom_worker_cmd {
	uint64_t type;         /* the plugin id */
	uint64_t urom_context; /* the host's cookie; copy it into the answering notification */
	uint64_t len;          /* bytes of plugin_cmd */
	uint8_t plugin_cmd[];
};

/* The descriptors below end in a struct that ends in a flexible array member: a GNU C
 * extension (GCC and clang), as in DOCA's header, which -pedantic reports. */

/* A command on its way to a plugin; the plugin free()s it. */
struct urom_worker_cmd_desc {
	ucs_list_link_t entry;
	uint64_t dest_id; /* the host connection; copy it into the answering notification */
	struct urom_worker_cmd worker_cmd;
};

/* A notification: header, then `len` bytes of plugin notification. */
struct urom_worker_notify {
	uint64_t type;         /* the plugin id */
	uint64_t urom_context; /* the cookie of the command this answers */
	uint64_t len;          /* bytes of plugin_notif */
	doca_error_t status;
	uint32_t reserved; /* zero */
	uint8_t plugin_notif[];
};

/* A notification on its way to a host; the plugin malloc()s it, the worker free()s it. */
struct urom_worker_notif_desc {
	ucs_list_link_t entry;
	uint64_t dest_id; /* the dest_id of the command it answers */
	struct urom_worker_notify worker_notif;
};

/* The operations of a plugin. */
struct urom_plugin_iface {
	/* The version of the headers the plugin was built with, set by DOCA_STRUCT_CTOR(). */
	DOCA_STRUCT_START;
	/* Creates the plugin's state and stores it in ctx->plugin_ctx. */
	doca_error_t (*open)(struct urom_worker_ctx *ctx);
	/* Releases what open created. */
	void (*close)(struct urom_worker_ctx *ctx);
	/* Copies the plugin's address into addr when *addr_len is large enough, else stores the
	 * needed length in *addr_len and returns DOCA_ERROR_INVALID_VALUE (the worker asks for
	 * the length first). */
	doca_error_t (*addr)(struct urom_worker_ctx *ctx, void *addr, size_t *addr_len);
	/* Takes the command descriptors off cmd_list and handles them; the plugin frees each it
	 * takes. A non-success return means the command was not taken: the worker answers it
	 * with that status. */
	doca_error_t (*worker_cmd)(struct urom_worker_ctx *ctx, ucs_list_link_t *cmd_list);
	/* Advances work, appends finished notification descriptors to notif_list (the worker
	 * frees them); returns DOCA_ERROR_EMPTY when there was nothing to do. */
	doca_error_t (*progress)(struct urom_worker_ctx *ctx, ucs_list_link_t *notif_list);
	/* Packs a notification (header and payload) into packed_notif, whose capacity is
	 * *packed_notif_len on entry; stores the packed length there. */
	doca_error_t (*notif_pack)(struct urom_worker_notify *notif, size_t *packed_notif_len, void *packed_notif);
};

/*
 * What the worker knows of the domain its host started: the members' plugin addresses and
 * registered buffers, by domain id (the ids the hosts gave doca_urom_domain_set_workers()).
 *
 * Every lookup returns DOCA_ERROR_INVALID_VALUE for a NULL ctx or output pointer, and
 * DOCA_ERROR_NOT_FOUND for a domain id or segment the worker does not know, which is every one
 * while no domain has been started on this worker, or a member that does not run this plugin;
 * memh_lookup and mkey_lookup return DOCA_ERROR_NOT_SUPPORTED for a buffer added without that
 * key. On failure the outputs are cleared (NULL pointers, zero lengths, segment -1). What a
 * lookup returns is read-only and stays valid until the plugin is closed.
 */
struct urom_domain_lookups_iface {
	/* The plugin address of domain member domain_id (its addr() bytes, which carry their
	 * own length, such as a UCP worker address). */
	doca_error_t (*addr_lookup)(struct urom_worker_ctx *ctx, uint64_t domain_id, void **addr);
	/* The index of the buffer of member domain_id that holds the address va. */
	doca_error_t (*seg_lookup)(struct urom_worker_ctx *ctx, uint64_t domain_id, uint64_t va, int *seg);
	/* The packed memory handle of buffer seg of member domain_id. */
	doca_error_t (*memh_lookup)(struct urom_worker_ctx *ctx, uint64_t domain_id, int seg, size_t *len, void **memh);
	/* The packed remote key of buffer seg of member domain_id. */
	doca_error_t (*mkey_lookup)(struct urom_worker_ctx *ctx, uint64_t domain_id, int seg, size_t *len, void **rkey);
};

/* What a plugin instance receives from the worker. */
struct urom_worker_ctx {
	struct urom_plugin_iface iface;                /* the plugin's own operations */
	struct urom_domain_lookups_iface domain_iface; /* set by the worker */
	void *plugin_ctx;                              /* the plugin's state, set by open */
};

/* The domain lookups, as plugins call them. */

static inline doca_error_t doca_urom_worker_domain_addr_lookup(struct urom_worker_ctx *ctx,
							       uint64_t domain_id,
							       void **addr)
{
	return ctx->domain_iface.addr_lookup(ctx, domain_id, addr);
}

static inline doca_error_t doca_urom_worker_domain_seg_lookup(struct urom_worker_ctx *ctx,
							      uint64_t domain_id,
							      uint64_t va,
							      int *seg)
{
	return ctx->domain_iface.seg_lookup(ctx, domain_id, va, seg);
}

static inline doca_error_t doca_urom_worker_domain_memh_lookup(struct urom_worker_ctx *ctx,
							       uint64_t domain_id,
							       int seg,
							       size_t *len,
							       void **memh)
{
	return ctx->domain_iface.memh_lookup(ctx, domain_id, seg, len, memh);
}

static inline doca_error_t doca_urom_worker_domain_mkey_lookup(struct urom_worker_ctx *ctx,
							       uint64_t domain_id,
							       int seg,
							       size_t *len,
							       void **rkey)
{
	return ctx->domain_iface.mkey_lookup(ctx, domain_id, seg, len, rkey);
}

/* The two symbols every plugin exports. */
doca_error_t urom_plugin_get_version(uint64_t *version);
doca_error_t urom_plugin_get_iface(struct urom_plugin_iface *iface);

/* The layout the worker expects (LP64 Linux: x86_64, aarch64). */
#if !defined(__cplusplus) && (defined(__x86_64__) || defined(__aarch64__))
_Static_assert(sizeof(struct urom_worker_cmd) == 24, "urom_worker_cmd layout");
_Static_assert(sizeof(struct urom_worker_notify) == 32, "urom_worker_notify layout");
_Static_assert(offsetof(struct urom_worker_notify, status) == 24, "urom_worker_notify layout");
_Static_assert(sizeof(struct urom_worker_cmd_desc) == 48, "urom_worker_cmd_desc layout");
_Static_assert(sizeof(struct urom_worker_notif_desc) == 56, "urom_worker_notif_desc layout");
_Static_assert(sizeof(struct urom_plugin_iface) == 56, "urom_plugin_iface layout");
_Static_assert(offsetof(struct urom_plugin_iface, open) == 8, "urom_plugin_iface layout");
_Static_assert(sizeof(struct urom_domain_lookups_iface) == 32, "urom_domain_lookups_iface layout");
_Static_assert(offsetof(struct urom_worker_ctx, domain_iface) == 56, "urom_worker_ctx layout");
_Static_assert(offsetof(struct urom_worker_ctx, plugin_ctx) == 88, "urom_worker_ctx layout");
_Static_assert(sizeof(struct urom_worker_ctx) == 96, "urom_worker_ctx layout");
_Static_assert(sizeof(struct doca_urom_service_plugin_info) == 64, "plugin info layout");
#endif

#ifdef __cplusplus
}
#endif

#endif /* DOCA_UROM_PLUGIN_H_ */
