/*
 * urom_plugin.h - the plugin interface of urom workers.
 *
 * Binary compatible with the public DOCA UROM plugin interface (doca_urom_plugin.h): a plugin
 * written for it compiles against this header and runs in a urom worker unchanged.
 *
 * A plugin is a shared object that exports two functions:
 *
 *   doca_error_t urom_plugin_get_version(uint64_t *version);
 *   doca_error_t urom_plugin_get_iface(struct urom_plugin_iface *iface);
 *
 * Ownership across the interface: the worker malloc()s every command descriptor it passes to
 * worker_cmd() and the plugin free()s it; the plugin malloc()s every notification descriptor
 * it returns from progress() and the worker free()s it.
 */
#ifndef UROM_PLUGIN_H_
#define UROM_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes, numbered as doca_error_t. */
#ifndef DOCA_ERROR_H_
typedef enum doca_error {
	DOCA_SUCCESS = 0,
	DOCA_ERROR_UNKNOWN = 1,
	DOCA_ERROR_NOT_PERMITTED = 2,
	DOCA_ERROR_IN_USE = 3,
	DOCA_ERROR_NOT_SUPPORTED = 4,
	DOCA_ERROR_AGAIN = 5,
	DOCA_ERROR_INVALID_VALUE = 6,
	DOCA_ERROR_NO_MEMORY = 7,
	DOCA_ERROR_INITIALIZATION = 8,
	DOCA_ERROR_TIME_OUT = 9,
	DOCA_ERROR_SHUTDOWN = 10,
	DOCA_ERROR_CONNECTION_RESET = 11,
	DOCA_ERROR_CONNECTION_ABORTED = 12,
	DOCA_ERROR_CONNECTION_INPROGRESS = 13,
	DOCA_ERROR_NOT_CONNECTED = 14,
	DOCA_ERROR_NO_LOCK = 15,
	DOCA_ERROR_NOT_FOUND = 16,
	DOCA_ERROR_IO_FAILED = 17,
	DOCA_ERROR_BAD_STATE = 18,
	DOCA_ERROR_UNSUPPORTED_VERSION = 19,
	DOCA_ERROR_OPERATING_SYSTEM = 20,
	DOCA_ERROR_DRIVER = 21,
	DOCA_ERROR_UNEXPECTED = 22,
	DOCA_ERROR_ALREADY_EXIST = 23,
	DOCA_ERROR_FULL = 24,
	DOCA_ERROR_EMPTY = 25,
	DOCA_ERROR_IN_PROGRESS = 26,
	DOCA_ERROR_TOO_BIG = 27,
	DOCA_ERROR_AUTHENTICATION = 28,
	DOCA_ERROR_BAD_CONFIG = 29,
	DOCA_ERROR_SKIPPED = 30,
} doca_error_t;
#endif

/* Intrusive doubly linked lists, as UCS defines them; a head points at itself when empty. */
#ifndef UCS_LIST_H_
typedef struct ucs_list_link {
	struct ucs_list_link *prev;
	struct ucs_list_link *next;
} ucs_list_link_t;

#define ucs_container_of(_ptr, _type, _member) \
	((_type *)((char *)(_ptr) - offsetof(_type, _member)))

static inline void ucs_list_head_init(ucs_list_link_t *head)
{
	head->prev = head;
	head->next = head;
}

static inline int ucs_list_is_empty(const ucs_list_link_t *head)
{
	return head->next == head;
}

static inline void ucs_list_add_tail(ucs_list_link_t *head, ucs_list_link_t *elem)
{
	elem->prev = head->prev;
	elem->next = head;
	head->prev->next = elem;
	head->prev = elem;
}

static inline void ucs_list_del(ucs_list_link_t *elem)
{
	elem->prev->next = elem->next;
	elem->next->prev = elem->prev;
}

static inline ucs_list_link_t *ucs_list_extract_head_link(ucs_list_link_t *head)
{
	ucs_list_link_t *first = head->next;

	ucs_list_del(first);
	return first;
}

/* Removes the first element of a non-empty list and returns its container. */
#define ucs_list_extract_head(_head, _type, _member) \
	ucs_container_of(ucs_list_extract_head_link(_head), _type, _member)
#endif

/* Size of a plugin name field; names hold one byte less. */
#define DOCA_UROM_PLUGIN_NAME_MAX_LEN 48

/* The interface version word this header describes. */
#define UROM_PLUGIN_IFACE_VERSION 1

/* Marks an interface as built against this header: call on the interface before returning it. */
#define DOCA_STRUCT_CTOR(_iface) ((_iface).version = UROM_PLUGIN_IFACE_VERSION)

/* A command: header, then `len` bytes of plugin command. */
struct urom_worker_cmd {
	uint64_t type;         /* the plugin id */
	uint64_t urom_context; /* the host's cookie, returned in the notification */
	uint64_t len;          /* bytes of plugin_cmd */
	uint8_t plugin_cmd[];
};

/* A notification: header, then `len` bytes of plugin notification. */
struct urom_worker_notify {
	uint64_t type;         /* the plugin id */
	uint64_t urom_context; /* the cookie of the command this answers */
	uint64_t len;          /* bytes of plugin_notif */
	doca_error_t status;
	uint32_t reserved;     /* zero */
	uint8_t plugin_notif[];
};

/* A command on its way to a plugin; the plugin free()s it. */
struct urom_worker_cmd_desc {
	ucs_list_link_t entry;
	uint64_t dest_id; /* the host connection; copy it into the answering notification */
	struct urom_worker_cmd worker_cmd;
};

/* A notification on its way to a host; the plugin malloc()s it, the worker free()s it. */
struct urom_worker_notif_desc {
	ucs_list_link_t entry;
	uint64_t dest_id;
	struct urom_worker_notify worker_notif;
};

struct urom_worker_ctx;

/* The operations of a plugin. */
struct urom_plugin_iface {
	size_t version; /* UROM_PLUGIN_IFACE_VERSION, set by DOCA_STRUCT_CTOR */
	/* Creates the plugin's state and stores it in ctx->plugin_ctx. */
	doca_error_t (*open)(struct urom_worker_ctx *ctx);
	/* Releases what open created. */
	void (*close)(struct urom_worker_ctx *ctx);
	/* Copies the endpoint address into addr when *addr_len is large enough, else stores the
	 * needed length in *addr_len and returns DOCA_ERROR_INVALID_VALUE. */
	doca_error_t (*addr)(struct urom_worker_ctx *ctx, void *addr, uint64_t *addr_len);
	/* Takes the command descriptors off cmd_list and handles them. A non-success return
	 * means the command was not taken: the worker answers it with that status. */
	doca_error_t (*worker_cmd)(struct urom_worker_ctx *ctx, ucs_list_link_t *cmd_list);
	/* Advances work, appends finished notification descriptors to notif_list; returns
	 * DOCA_ERROR_EMPTY when there was nothing to do. */
	doca_error_t (*progress)(struct urom_worker_ctx *ctx, ucs_list_link_t *notif_list);
	/* Packs a notification (header and payload) into packed_notif, whose capacity is
	 * *packed_notif_len on entry; stores the packed length there. */
	doca_error_t (*notif_pack)(struct urom_worker_notify *notif, size_t *packed_notif_len, void *packed_notif);
};

/* What a plugin instance receives from the worker. */
struct urom_worker_ctx {
	struct urom_plugin_iface iface;
	doca_error_t (*addr_lookup)(struct urom_worker_ctx *ctx, uint64_t domain_id, void **addr, uint64_t *addr_len);
	doca_error_t (*seg_lookup)(struct urom_worker_ctx *ctx, uint64_t domain_id, uint64_t va, int *seg);
	doca_error_t (*memh_lookup)(struct urom_worker_ctx *ctx, uint64_t domain_id, int seg, size_t *memh_len, void **memh);
	doca_error_t (*mkey_lookup)(struct urom_worker_ctx *ctx, uint64_t domain_id, int seg, void **rkey);
	void *plugin_ctx;
};

/* What the service reports for each plugin. */
struct doca_urom_service_plugin_info {
	uint64_t id;
	uint64_t version;
	char plugin_name[DOCA_UROM_PLUGIN_NAME_MAX_LEN];
};

/* The two symbols every plugin exports. */
doca_error_t urom_plugin_get_version(uint64_t *version);
doca_error_t urom_plugin_get_iface(struct urom_plugin_iface *iface);

#if !defined(__cplusplus) && (defined(__x86_64__) || defined(__aarch64__))
_Static_assert(sizeof(struct urom_worker_cmd) == 24, "urom_worker_cmd layout");
_Static_assert(sizeof(struct urom_worker_notify) == 32, "urom_worker_notify layout");
_Static_assert(sizeof(struct urom_worker_cmd_desc) == 48, "urom_worker_cmd_desc layout");
_Static_assert(sizeof(struct urom_worker_notif_desc) == 56, "urom_worker_notif_desc layout");
_Static_assert(sizeof(struct urom_plugin_iface) == 56, "urom_plugin_iface layout");
_Static_assert(sizeof(struct urom_worker_ctx) == 96, "urom_worker_ctx layout");
_Static_assert(offsetof(struct urom_worker_ctx, plugin_ctx) == 88, "urom_worker_ctx layout");
_Static_assert(sizeof(struct doca_urom_service_plugin_info) == 64, "plugin info layout");
#endif

#ifdef __cplusplus
}
#endif

#endif /* UROM_PLUGIN_H_ */
