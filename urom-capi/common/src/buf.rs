//! Buffers, memory maps and buffer inventories (`doca_buf.h`, `doca_mmap.h`,
//! `doca_buf_inventory.h`): as much as a UROM host needs.
//!
//! A buffer describes `len` bytes at `head` and, inside them, its data. Buffers come from an
//! inventory (over a started memory map whose range holds them) or from another library for
//! memory it owns (a UROM command task's payload and response). Nothing here registers memory
//! with a device: urom copies command payloads into its channels, so a memory map only records
//! its range, devices and permissions. Buffers may be chained into lists.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use urom_capi_abi::{DocaData, Status};

/// Marks a live buffer.
pub(crate) const BUF_MAGIC: u64 = 0x7572_6f6d_6275_6631; // "urombuf1"
/// Marks a live memory map.
pub(crate) const MMAP_MAGIC: u64 = 0x7572_6f6d_6d6d_6170; // "urommmap"
/// Marks a live inventory.
pub(crate) const INVENTORY_MAGIC: u64 = 0x7572_6f6d_696e_7631; // "urominv1"

/// Who gives a buffer back.
pub(crate) enum Owner {
    /// Another library; `doca_buf_dec_refcount()` may not free it.
    Library,
    /// An inventory and the memory map the buffer lies in.
    Inventory(Rc<InventoryInner>, Rc<MmapInner>),
}

/// `struct doca_buf`.
pub struct BufObj {
    pub(crate) magic: Cell<u64>,
    head: *mut u8,
    len: usize,
    /// The data's offset from `head` and its length.
    data: Cell<(usize, usize)>,
    refcount: Cell<u16>,
    /// The next buffer of its list (the handle's address), 0 at the end.
    next: Cell<usize>,
    /// Whether it heads its list (buffers chained behind another do not).
    is_head: Cell<bool>,
    pub(crate) owner: Owner,
}

impl BufObj {
    pub(crate) fn new(head: *mut u8, len: usize, owner: Owner) -> Box<Self> {
        Box::new(Self {
            magic: Cell::new(BUF_MAGIC),
            head,
            len,
            data: Cell::new((0, 0)),
            refcount: Cell::new(1),
            next: Cell::new(0),
            is_head: Cell::new(true),
            owner,
        })
    }

    /// The buffer, if `buf` points to a live one.
    pub(crate) fn check(buf: Option<&Self>) -> Result<&Self, Status> {
        buf.filter(|buf| buf.magic.get() == BUF_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    pub(crate) fn retire(&self) {
        self.magic.set(0);
    }

    pub(crate) fn head(&self) -> *mut u8 {
        self.head
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn data(&self) -> (*mut u8, usize) {
        let (offset, len) = self.data.get();
        (self.head.wrapping_add(offset), len)
    }

    /// Sets the data to `len` bytes at `data`, which must lie in the buffer.
    pub(crate) fn set_data(&self, data: *mut u8, len: usize) -> Result<(), Status> {
        let offset = (data as usize)
            .checked_sub(self.head as usize)
            .ok_or(Status::InvalidValue)?;
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                self.data.set((offset, len));
                Ok(())
            }
            _ => Err(Status::InvalidValue),
        }
    }

    /// Sets the data's length, keeping where it starts.
    pub(crate) fn set_data_len(&self, len: usize) -> Result<(), Status> {
        let (offset, _) = self.data.get();
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                self.data.set((offset, len));
                Ok(())
            }
            _ => Err(Status::InvalidValue),
        }
    }

    pub(crate) fn refcount(&self) -> u16 {
        self.refcount.get()
    }

    pub(crate) fn inc_refcount(&self) -> Result<u16, Status> {
        let count = self.refcount.get().checked_add(1).ok_or(Status::TooBig)?;
        self.refcount.set(count);
        Ok(count)
    }

    /// Drops a reference; `Ok(0)` means the caller frees the list this buffer heads.
    pub(crate) fn dec_refcount(&self) -> Result<u16, Status> {
        if matches!(self.owner, Owner::Library) {
            return Err(Status::NotPermitted);
        }
        if !self.is_head.get() {
            return Err(Status::NotPermitted);
        }
        let count = self.refcount.get().saturating_sub(1);
        self.refcount.set(count);
        Ok(count)
    }

    pub(crate) fn next(&self) -> usize {
        self.next.get()
    }

    pub(crate) fn is_head(&self) -> bool {
        self.is_head.get()
    }

    pub(crate) fn set_next(&self, next: usize) {
        self.next.set(next);
    }

    pub(crate) fn set_is_head(&self, head: bool) {
        self.is_head.set(head);
    }
}

impl Drop for BufObj {
    fn drop(&mut self) {
        if let Owner::Inventory(inventory, mmap) = &self.owner {
            inventory.used.set(inventory.used.get().saturating_sub(1));
            mmap.buffers.set(mmap.buffers.get().saturating_sub(1));
        }
    }
}

/// `struct doca_mmap`.
pub struct MmapObj {
    pub(crate) magic: Cell<u64>,
    pub(crate) inner: Rc<MmapInner>,
}

pub(crate) struct MmapInner {
    /// Start address and length.
    range: Cell<Option<(usize, usize)>>,
    started: Cell<bool>,
    /// Devices added (handle addresses).
    devs: RefCell<Vec<usize>>,
    permissions: Cell<u32>,
    /// Buffers allocated over it and not yet given back.
    buffers: Cell<usize>,
    user_data: Cell<u64>,
}

impl MmapObj {
    pub(crate) fn new() -> Box<Self> {
        Box::new(Self {
            magic: Cell::new(MMAP_MAGIC),
            inner: Rc::new(MmapInner {
                range: Cell::new(None),
                started: Cell::new(false),
                devs: RefCell::new(Vec::new()),
                permissions: Cell::new(0),
                buffers: Cell::new(0),
                user_data: Cell::new(0),
            }),
        })
    }

    /// The map, if `mmap` points to a live one.
    pub(crate) fn check(mmap: Option<&Self>) -> Result<&Self, Status> {
        mmap.filter(|mmap| mmap.magic.get() == MMAP_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    /// Whether buffers still lie in it (then it cannot be destroyed).
    pub(crate) fn in_use(&self) -> bool {
        self.inner.buffers.get() > 0
    }

    pub(crate) fn retire(&self) {
        self.magic.set(0);
    }

    fn configurable(&self) -> Result<(), Status> {
        if self.inner.started.get() {
            Err(Status::BadState)
        } else {
            Ok(())
        }
    }

    pub(crate) fn set_memrange(&self, addr: usize, len: usize) -> Result<(), Status> {
        self.configurable()?;
        if addr == 0 || len == 0 || addr.checked_add(len).is_none() {
            return Err(Status::InvalidValue);
        }
        self.inner.range.set(Some((addr, len)));
        Ok(())
    }

    pub(crate) fn memrange(&self) -> Result<(usize, usize), Status> {
        self.inner.range.get().ok_or(Status::BadState)
    }

    pub(crate) fn set_permissions(&self, permissions: u32) -> Result<(), Status> {
        self.configurable()?;
        self.inner.permissions.set(permissions);
        Ok(())
    }

    pub(crate) fn permissions(&self) -> u32 {
        self.inner.permissions.get()
    }

    pub(crate) fn add_dev(&self, dev: usize) -> Result<(), Status> {
        self.configurable()?;
        let mut devs = self.inner.devs.borrow_mut();
        if devs.contains(&dev) {
            return Err(Status::AlreadyExist);
        }
        devs.push(dev);
        Ok(())
    }

    pub(crate) fn rm_dev(&self, dev: usize) -> Result<(), Status> {
        self.configurable()?;
        let mut devs = self.inner.devs.borrow_mut();
        let before = devs.len();
        devs.retain(|&d| d != dev);
        if devs.len() == before {
            return Err(Status::NotFound);
        }
        Ok(())
    }

    /// `doca_mmap_start()`: needs a memory range.
    pub(crate) fn start(&self) -> Result<(), Status> {
        if self.inner.range.get().is_none() {
            return Err(Status::BadState);
        }
        self.inner.started.set(true);
        Ok(())
    }

    /// `doca_mmap_stop()`: not while buffers lie in it.
    pub(crate) fn stop(&self) -> Result<(), Status> {
        if self.in_use() {
            return Err(Status::InUse);
        }
        self.inner.started.set(false);
        Ok(())
    }

    pub(crate) fn user_data(&self) -> DocaData {
        DocaData::from_bits(self.inner.user_data.get())
    }

    pub(crate) fn set_user_data(&self, data: DocaData) {
        self.inner.user_data.set(data.bits());
    }
}

/// `struct doca_buf_inventory`.
pub struct InventoryObj {
    pub(crate) magic: Cell<u64>,
    pub(crate) inner: Rc<InventoryInner>,
}

pub(crate) struct InventoryInner {
    capacity: usize,
    /// Buffers handed out and not yet given back.
    used: Cell<usize>,
    started: Cell<bool>,
    user_data: Cell<u64>,
}

impl InventoryObj {
    pub(crate) fn new(capacity: usize) -> Result<Box<Self>, Status> {
        if capacity == 0 || u32::try_from(capacity).is_err() {
            return Err(Status::InvalidValue);
        }
        Ok(Box::new(Self {
            magic: Cell::new(INVENTORY_MAGIC),
            inner: Rc::new(InventoryInner {
                capacity,
                used: Cell::new(0),
                started: Cell::new(false),
                user_data: Cell::new(0),
            }),
        }))
    }

    /// The inventory, if `inventory` points to a live one.
    pub(crate) fn check(inventory: Option<&Self>) -> Result<&Self, Status> {
        inventory
            .filter(|inventory| inventory.magic.get() == INVENTORY_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    /// Whether buffers are still out (then it cannot be destroyed).
    pub(crate) fn in_use(&self) -> bool {
        self.inner.used.get() > 0
    }

    pub(crate) fn retire(&self) {
        self.magic.set(0);
    }

    pub(crate) fn start(&self) {
        self.inner.started.set(true);
    }

    pub(crate) fn stop(&self) {
        self.inner.started.set(false);
    }

    pub(crate) fn capacity(&self) -> usize {
        self.inner.capacity
    }

    pub(crate) fn free_elements(&self) -> usize {
        self.inner.capacity - self.inner.used.get()
    }

    pub(crate) fn user_data(&self) -> DocaData {
        DocaData::from_bits(self.inner.user_data.get())
    }

    pub(crate) fn set_user_data(&self, data: DocaData) {
        self.inner.user_data.set(data.bits());
    }

    /// `doca_buf_inventory_buf_get_by_args()`: a buffer of `len` bytes at `addr` with `data_len`
    /// bytes of data at `data`, inside the started map `mmap`.
    pub(crate) fn get(
        &self,
        mmap: &MmapObj,
        addr: *mut u8,
        len: usize,
        data: *mut u8,
        data_len: usize,
    ) -> Result<Box<BufObj>, Status> {
        if !self.inner.started.get() || !mmap.inner.started.get() {
            return Err(Status::BadState);
        }
        let (start, size) = mmap.memrange()?;
        let begin = addr as usize;
        let inside = begin >= start
            && begin
                .checked_add(len)
                .is_some_and(|end| end <= start + size);
        if !inside {
            return Err(Status::InvalidValue);
        }
        if self.inner.used.get() == self.inner.capacity {
            return Err(Status::NoMemory);
        }
        // Counted first: dropping the buffer (below, on bad data) gives the counts back.
        self.inner.used.set(self.inner.used.get() + 1);
        mmap.inner.buffers.set(mmap.inner.buffers.get() + 1);
        let buf = BufObj::new(
            addr,
            len,
            Owner::Inventory(Rc::clone(&self.inner), Rc::clone(&mmap.inner)),
        );
        buf.set_data(data, data_len)?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_stays_inside_the_buffer() {
        let mut memory = [0u8; 64];
        let head = memory.as_mut_ptr();
        let buf = BufObj::new(head, 64, Owner::Library);
        assert_eq!(buf.data(), (head, 0));
        buf.set_data(head.wrapping_add(8), 56).unwrap();
        assert_eq!(buf.data(), (head.wrapping_add(8), 56));
        assert_eq!(
            buf.set_data(head.wrapping_add(8), 57),
            Err(Status::InvalidValue)
        );
        assert_eq!(
            buf.set_data(head.wrapping_sub(1), 1),
            Err(Status::InvalidValue)
        );
        assert_eq!(buf.set_data_len(57), Err(Status::InvalidValue));
        buf.set_data_len(10).unwrap();
        assert_eq!(buf.data(), (head.wrapping_add(8), 10));
        assert_eq!(buf.dec_refcount(), Err(Status::NotPermitted));
    }

    #[test]
    fn inventories_count_their_buffers_and_check_the_map() {
        let mut memory = [0u8; 64];
        let head = memory.as_mut_ptr();
        let inventory = InventoryObj::new(2).unwrap();
        let mmap = MmapObj::new();
        assert_eq!(
            inventory.get(&mmap, head, 8, head, 0).err(),
            Some(Status::BadState)
        );
        inventory.start();
        assert_eq!(mmap.start(), Err(Status::BadState));
        mmap.set_memrange(head as usize, 64).unwrap();
        mmap.start().unwrap();
        assert_eq!(mmap.set_memrange(head as usize, 8), Err(Status::BadState));
        let outside = inventory.get(&mmap, head.wrapping_add(60), 8, head, 0);
        assert_eq!(outside.err(), Some(Status::InvalidValue));
        let one = inventory.get(&mmap, head, 32, head, 4).unwrap();
        let two = inventory.get(&mmap, head.wrapping_add(32), 32, head, 0);
        assert_eq!(two.err(), Some(Status::InvalidValue));
        let two = inventory
            .get(&mmap, head.wrapping_add(32), 32, head.wrapping_add(32), 0)
            .unwrap();
        assert_eq!(
            inventory.get(&mmap, head, 8, head, 0).err(),
            Some(Status::NoMemory)
        );
        assert_eq!(inventory.free_elements(), 0);
        assert!(inventory.in_use() && mmap.in_use());
        assert_eq!(mmap.stop(), Err(Status::InUse));
        assert_eq!(one.dec_refcount(), Ok(0));
        drop(one);
        drop(two);
        assert!(!inventory.in_use() && !mmap.in_use());
        assert_eq!(inventory.free_elements(), 2);
    }
}
