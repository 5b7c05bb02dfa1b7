/*
 * doca_types.h - types shared by DOCA's libraries, as urom's host libraries use them.
 */
#ifndef DOCA_TYPES_H_
#define DOCA_TYPES_H_

#include <stdint.h>

#ifdef __linux__
#include <linux/types.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A descriptor to wait on (progress engine notifications). */
typedef int doca_event_handle_t;
#define doca_event_invalid_handle -1
/* The progress engine's notification handle. */
typedef doca_event_handle_t doca_notification_handle_t;

/* Bytes in a GID. */
#define DOCA_GID_BYTE_LENGTH 16

/* Opaque data: a pointer or a 64-bit integer. */
union doca_data {
	void *ptr;
	uint64_t u64;
};

/* One element of a gather list. */
struct doca_gather_list {
	void *addr;
	uint64_t len;
	struct doca_gather_list *next;
};

/* Access a memory map grants (doca_mmap_set_permissions()). */
enum doca_access_flag {
	DOCA_ACCESS_FLAG_LOCAL_READ_ONLY = 0,
	DOCA_ACCESS_FLAG_LOCAL_READ_WRITE = (1 << 0),
	DOCA_ACCESS_FLAG_RDMA_READ = (1 << 1),
	DOCA_ACCESS_FLAG_RDMA_WRITE = (1 << 2),
	DOCA_ACCESS_FLAG_RDMA_ATOMIC = (1 << 3),
	DOCA_ACCESS_FLAG_PCI_READ_ONLY = (1 << 4),
	DOCA_ACCESS_FLAG_PCI_READ_WRITE = (1 << 5),
	DOCA_ACCESS_FLAG_PCI_RELAXED_ORDERING = (1 << 6),
};

/* PCI function types. */
enum doca_pci_func_type {
	DOCA_PCI_FUNC_TYPE_PF = 0,
	DOCA_PCI_FUNC_TYPE_VF,
	DOCA_PCI_FUNC_TYPE_SF,
};

#ifdef __linux__
typedef __be16 doca_be16_t;
typedef __be32 doca_be32_t;
typedef __be64 doca_be64_t;
#endif

#ifdef __cplusplus
}
#endif

#endif /* DOCA_TYPES_H_ */
