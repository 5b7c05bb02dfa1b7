//! The intrusive lists of the plugin ABI (`ucs_list_link_t`), as the worker and the SDK use
//! them.

use core::ptr;

use super::ListLink;
use urom_wire::Status;

impl ListLink {
    /// A link in no list.
    pub(crate) const fn unlinked() -> Self {
        Self {
            prev: ptr::null_mut(),
            next: ptr::null_mut(),
        }
    }
}

/// `malloc`s descriptor `desc` followed by `payload` (the ABI's flexible array member), the way
/// descriptors cross the plugin interface; whoever receives it `free`s it.
pub(crate) fn malloc_desc<D>(desc: D, payload: &[u8]) -> Result<*mut D, Status> {
    let size = size_of::<D>() + payload.len();
    // SAFETY: malloc has no preconditions.
    let raw = unsafe { libc::malloc(size) }.cast::<D>();
    if raw.is_null() {
        return Err(Status::NoMemory);
    }
    // SAFETY: a fresh allocation of `size` bytes, aligned for any descriptor type.
    unsafe { raw.write(desc) };
    // SAFETY: the payload area follows the descriptor inside the same allocation.
    let payload_dst = unsafe { raw.add(1) }.cast::<u8>();
    // SAFETY: room for `payload.len()` bytes; the regions are distinct.
    unsafe { ptr::copy_nonoverlapping(payload.as_ptr(), payload_dst, payload.len()) };
    Ok(raw)
}

/// A list head at a stable address, allocated once.
pub(crate) struct ListHead {
    // INVARIANTS: `link` is a valid circular list whose elements the owner of the list put
    // there; the box keeps its address fixed while elements point at it.
    link: Box<ListLink>,
}

impl ListHead {
    /// An empty list.
    pub(crate) fn new() -> Self {
        let mut link = Box::new(ListLink::unlinked());
        let me: *mut ListLink = &mut *link;
        link.prev = me;
        link.next = me;
        Self { link }
    }

    /// The head, as the plugin functions take it.
    pub(crate) fn as_ptr(&mut self) -> *mut ListLink {
        &mut *self.link
    }

    /// Appends `link`.
    ///
    /// # Safety
    /// `link` points to a valid link that is in no list and outlives its stay in this one.
    pub(crate) unsafe fn push_back(&mut self, link: *mut ListLink) {
        // SAFETY: the head is a valid list (invariant); `link` is valid (caller).
        unsafe { push_back(self.as_ptr(), link) }
    }

    /// Removes and returns the first link.
    ///
    /// # Safety
    /// Every element of the list is a valid link (whoever put it there kept it alive).
    pub(crate) unsafe fn pop_front(&mut self) -> Option<*mut ListLink> {
        // SAFETY: the head is a valid list whose elements are valid (invariant and caller).
        unsafe { pop_front(self.as_ptr()) }
    }
}

/// Appends `link` to the list at `head`.
///
/// # Safety
/// `head` is a valid list head whose elements are valid; `link` is a valid link in no list.
pub(crate) unsafe fn push_back(head: *mut ListLink, link: *mut ListLink) {
    // SAFETY: `head` is valid (caller).
    let last = unsafe { (*head).prev };
    // SAFETY: `link` is valid (caller).
    unsafe {
        (*link).prev = last;
    }
    // SAFETY: as above.
    unsafe {
        (*link).next = head;
    }
    // SAFETY: `last` is the head or a valid element (caller).
    unsafe {
        (*last).next = link;
    }
    // SAFETY: `head` is valid (caller).
    unsafe {
        (*head).prev = link;
    }
}

/// Removes and returns the first link of the list at `head`.
///
/// # Safety
/// `head` is a valid list head whose elements are valid.
pub(crate) unsafe fn pop_front(head: *mut ListLink) -> Option<*mut ListLink> {
    // SAFETY: `head` is valid (caller).
    let first = unsafe { (*head).next };
    if ptr::eq(first, head) {
        return None;
    }
    // SAFETY: the list is not empty, so `first` is a valid element (caller).
    let next = unsafe { (*first).next };
    // SAFETY: `head` is valid (caller).
    unsafe {
        (*head).next = next;
    }
    // SAFETY: `next` is the head or a valid element (caller).
    unsafe {
        (*next).prev = head;
    }
    Some(first)
}

// SAFETY: the head owns no thread-bound data; the elements it links are owned by whoever holds
// the head, and moving the head to another thread moves that ownership with it.
unsafe impl Send for ListHead {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_and_pop_keep_order() {
        let mut head = ListHead::new();
        let mut links: Vec<ListLink> = (0..3).map(|_| ListLink::unlinked()).collect();
        let pointers: Vec<*mut ListLink> = links.iter_mut().map(|l| l as *mut ListLink).collect();
        for &link in &pointers {
            // SAFETY: each link is alive for the whole test and in no other list.
            unsafe { head.push_back(link) };
        }
        for &expected in &pointers {
            // SAFETY: all elements are alive.
            assert_eq!(unsafe { head.pop_front() }, Some(expected));
        }
        // SAFETY: the list is empty.
        assert_eq!(unsafe { head.pop_front() }, None);
    }
}
