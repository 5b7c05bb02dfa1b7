//! `doca_buf.h`, `doca_mmap.h` and `doca_buf_inventory.h`.

use std::ffi::c_void;

use urom_capi_abi::{DocaData, DocaError, Status};

use super::{arg, guard, reclaim};
use crate::buf::{BufObj, InventoryObj, MmapObj, Owner};
use crate::dev::DevObj;

/// The buffer at a list link (a handle address).
fn buf_at<'a>(addr: usize) -> Option<&'a BufObj> {
    // SAFETY: list links hold the handles of live buffers: a buffer is freed only with the
    // whole list it heads (`free_list`), and only heads can be freed.
    BufObj::check(unsafe { (addr as *const BufObj).as_ref() }).ok()
}

/// The last buffer of the list `head` starts.
fn last_of(head: &BufObj) -> &BufObj {
    let mut last = head;
    while let Some(next) = buf_at(last.next()) {
        last = next;
    }
    last
}

/// Frees the list `head` (a live inventory buffer heading its list) starts.
fn free_list(head: *mut BufObj) {
    let mut addr = head as usize;
    while let Some(buf) = buf_at(addr) {
        let next = buf.next();
        buf.retire();
        // SAFETY: inventory buffers come from `Box::into_raw` in
        // `doca_buf_inventory_buf_get_by_args`, and each element of a list is freed once here.
        drop(unsafe { reclaim(addr as *mut BufObj) });
        addr = next;
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_get_head(
    buf: Option<&BufObj>,
    head: Option<&mut *mut c_void>,
) -> DocaError {
    guard(|| {
        let buf = BufObj::check(buf)?;
        *arg(head)? = buf.head().cast();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_get_len(buf: Option<&BufObj>, len: Option<&mut usize>) -> DocaError {
    guard(|| {
        let buf = BufObj::check(buf)?;
        *arg(len)? = buf.len();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_get_data(
    buf: Option<&BufObj>,
    data: Option<&mut *mut c_void>,
) -> DocaError {
    guard(|| {
        let buf = BufObj::check(buf)?;
        *arg(data)? = buf.data().0.cast();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_get_data_len(
    buf: Option<&BufObj>,
    data_len: Option<&mut usize>,
) -> DocaError {
    guard(|| {
        let buf = BufObj::check(buf)?;
        *arg(data_len)? = buf.data().1;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_set_data(
    buf: Option<&BufObj>,
    data: *mut c_void,
    data_len: usize,
) -> DocaError {
    guard(|| BufObj::check(buf)?.set_data(data.cast(), data_len))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_set_data_len(buf: Option<&BufObj>, data_len: usize) -> DocaError {
    guard(|| BufObj::check(buf)?.set_data_len(data_len))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_reset_data_len(buf: Option<&BufObj>) -> DocaError {
    guard(|| BufObj::check(buf)?.set_data_len(0))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_get_refcount(
    buf: Option<&BufObj>,
    refcount: Option<&mut u16>,
) -> DocaError {
    guard(|| {
        let buf = BufObj::check(buf)?;
        *arg(refcount)? = buf.refcount();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_inc_refcount(
    buf: Option<&BufObj>,
    refcount: Option<&mut u16>,
) -> DocaError {
    guard(|| {
        let count = BufObj::check(buf)?.inc_refcount()?;
        if let Some(out) = refcount {
            *out = count;
        }
        Ok(())
    })
}

/// Drops a reference to an inventory buffer heading its list; at zero the whole list goes back
/// to its inventory. Buffers that belong to a task (a UROM command's payload and response) are
/// not counted: `DOCA_ERROR_NOT_PERMITTED`.
///
/// # Safety
///
/// `buf` is NULL or a live buffer of this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_buf_dec_refcount(
    buf: *mut BufObj,
    refcount: Option<&mut u16>,
) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live buffer.
        let live = BufObj::check(unsafe { buf.as_ref() })?;
        let count = live.dec_refcount()?;
        if let Some(out) = refcount {
            *out = count;
        }
        if count == 0 {
            free_list(buf);
        }
        Ok(())
    })
}

/// Appends the list `list2` heads to the list `list1` heads.
#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_chain_list(list1: Option<&BufObj>, list2: Option<&BufObj>) -> DocaError {
    guard(|| {
        let (first, second) = (BufObj::check(list1)?, BufObj::check(list2)?);
        if std::ptr::eq(first, second) || !first.is_head() || !second.is_head() {
            return Err(Status::NotPermitted);
        }
        if matches!(first.owner, Owner::Library) || matches!(second.owner, Owner::Library) {
            return Err(Status::NotPermitted);
        }
        last_of(first).set_next(second as *const BufObj as usize);
        second.set_is_head(false);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_get_next_in_list(
    buf: Option<&BufObj>,
    next_buf: Option<&mut *mut BufObj>,
) -> DocaError {
    guard(|| {
        let buf = BufObj::check(buf)?;
        let out = arg(next_buf)?;
        *out = buf.next() as *mut BufObj;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_get_last_in_list(
    buf: Option<&BufObj>,
    last_buf: Option<&mut *mut BufObj>,
) -> DocaError {
    guard(|| {
        let buf = BufObj::check(buf)?;
        *arg(last_buf)? = last_of(buf) as *const BufObj as *mut BufObj;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_get_list_len(
    buf: Option<&BufObj>,
    num_elements: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        let mut cur = BufObj::check(buf)?;
        let mut count = 1u32;
        while let Some(next) = buf_at(cur.next()) {
            count += 1;
            cur = next;
        }
        *arg(num_elements)? = count;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_create(mmap: Option<&mut *mut MmapObj>) -> DocaError {
    guard(|| {
        *arg(mmap)? = Box::into_raw(MmapObj::new());
        Ok(())
    })
}

/// Destroys a memory map no buffer lies in (`DOCA_ERROR_NOT_PERMITTED` otherwise).
///
/// # Safety
///
/// `mmap` is NULL or a live map from `doca_mmap_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_mmap_destroy(mmap: *mut MmapObj) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live map.
        let live = MmapObj::check(unsafe { mmap.as_ref() })?;
        if live.in_use() {
            return Err(Status::NotPermitted);
        }
        live.retire();
        // SAFETY: maps come from `Box::into_raw` in `doca_mmap_create`.
        drop(unsafe { reclaim(mmap) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_set_memrange(
    mmap: Option<&MmapObj>,
    addr: *mut c_void,
    len: usize,
) -> DocaError {
    guard(|| MmapObj::check(mmap)?.set_memrange(addr as usize, len))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_get_memrange(
    mmap: Option<&MmapObj>,
    addr: Option<&mut *mut c_void>,
    len: Option<&mut usize>,
) -> DocaError {
    guard(|| {
        let (start, size) = MmapObj::check(mmap)?.memrange()?;
        *arg(addr)? = start as *mut c_void;
        *arg(len)? = size;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_set_permissions(mmap: Option<&MmapObj>, access_mask: u32) -> DocaError {
    guard(|| MmapObj::check(mmap)?.set_permissions(access_mask))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_get_permissions(
    mmap: Option<&MmapObj>,
    access_mask: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        let mmap = MmapObj::check(mmap)?;
        *arg(access_mask)? = mmap.permissions();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_add_dev(mmap: Option<&MmapObj>, dev: Option<&DevObj>) -> DocaError {
    guard(|| {
        let mmap = MmapObj::check(mmap)?;
        let dev = DevObj::check(dev)?;
        mmap.add_dev(dev as *const DevObj as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_rm_dev(mmap: Option<&MmapObj>, dev: Option<&DevObj>) -> DocaError {
    guard(|| {
        let mmap = MmapObj::check(mmap)?;
        let dev = DevObj::check(dev)?;
        mmap.rm_dev(dev as *const DevObj as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_start(mmap: Option<&MmapObj>) -> DocaError {
    guard(|| MmapObj::check(mmap)?.start())
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_stop(mmap: Option<&MmapObj>) -> DocaError {
    guard(|| MmapObj::check(mmap)?.stop())
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_set_user_data(
    mmap: Option<&MmapObj>,
    user_data: DocaData,
) -> DocaError {
    guard(|| {
        MmapObj::check(mmap)?.set_user_data(user_data);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_mmap_get_user_data(
    mmap: Option<&MmapObj>,
    user_data: Option<&mut DocaData>,
) -> DocaError {
    guard(|| {
        let mmap = MmapObj::check(mmap)?;
        *arg(user_data)? = mmap.user_data();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_inventory_create(
    num_elements: usize,
    inventory: Option<&mut *mut InventoryObj>,
) -> DocaError {
    guard(|| {
        let out = arg(inventory)?;
        *out = Box::into_raw(InventoryObj::new(num_elements)?);
        Ok(())
    })
}

/// Destroys an inventory whose buffers all came back (`DOCA_ERROR_IN_USE` otherwise).
///
/// # Safety
///
/// `inventory` is NULL or a live inventory from `doca_buf_inventory_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_buf_inventory_destroy(inventory: *mut InventoryObj) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live inventory.
        let live = InventoryObj::check(unsafe { inventory.as_ref() })?;
        if live.in_use() {
            return Err(Status::InUse);
        }
        live.retire();
        // SAFETY: inventories come from `Box::into_raw` in `doca_buf_inventory_create`.
        drop(unsafe { reclaim(inventory) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_inventory_start(inventory: Option<&InventoryObj>) -> DocaError {
    guard(|| {
        InventoryObj::check(inventory)?.start();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_inventory_stop(inventory: Option<&InventoryObj>) -> DocaError {
    guard(|| {
        InventoryObj::check(inventory)?.stop();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_inventory_buf_get_by_args(
    inventory: Option<&InventoryObj>,
    mmap: Option<&MmapObj>,
    addr: *mut c_void,
    len: usize,
    data: *mut c_void,
    data_len: usize,
    buf: Option<&mut *mut BufObj>,
) -> DocaError {
    guard(|| {
        let inventory = InventoryObj::check(inventory)?;
        let mmap = MmapObj::check(mmap)?;
        let out = arg(buf)?;
        let made = inventory.get(mmap, addr.cast(), len, data.cast(), data_len)?;
        *out = Box::into_raw(made);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_inventory_get_num_elements(
    inventory: Option<&InventoryObj>,
    num_of_elements: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        let inventory = InventoryObj::check(inventory)?;
        *arg(num_of_elements)? = u32::try_from(inventory.capacity()).map_err(|_| Status::TooBig)?;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_inventory_get_num_free_elements(
    inventory: Option<&InventoryObj>,
    num_of_free_elements: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        let inventory = InventoryObj::check(inventory)?;
        *arg(num_of_free_elements)? =
            u32::try_from(inventory.free_elements()).map_err(|_| Status::TooBig)?;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_inventory_set_user_data(
    inventory: Option<&InventoryObj>,
    user_data: DocaData,
) -> DocaError {
    guard(|| {
        InventoryObj::check(inventory)?.set_user_data(user_data);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_buf_inventory_get_user_data(
    inventory: Option<&InventoryObj>,
    user_data: Option<&mut DocaData>,
) -> DocaError {
    guard(|| {
        let inventory = InventoryObj::check(inventory)?;
        *arg(user_data)? = inventory.user_data();
        Ok(())
    })
}
