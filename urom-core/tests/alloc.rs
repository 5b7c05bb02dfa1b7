//! After setup, sending, receiving and the task slots allocate nothing: a counting global
//! allocator watches this test's thread while it moves frames and tasks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use urom_core::host::{CompletedTask, TaskSlots};
use urom_core::transport::ChannelConfig;
use urom_core::transport::loopback::LoopbackConnection;
use urom_core::transport::shm::ShmConnection;
use urom_core::transport::{Transport, WaitMode};
use urom_core::wire::{MaxMsgSize, Status};

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: every call is forwarded to the system allocator unchanged; counting touches only
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc` above, with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn count() {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
    });
}

/// Allocations made by `f` on this thread.
fn allocations_in(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    ALLOCATIONS.with(|n| n.get())
}

fn done(task: &CompletedTask<'_>) {
    assert_eq!(task.user_data[0], 7);
}

fn exchange<C: Transport>(a: &mut C, b: &mut C, rounds: u32) {
    let mut frame = [0u8; 256];
    let mut slots = TaskSlots::new(16, 256, 64).unwrap();
    let mut run = |a: &mut C, b: &mut C, rounds: u32| {
        for i in 0..rounds {
            let len = 1 + (i as usize * 37) % frame.len();
            frame[0] = i as u8;
            a.send(&frame[..len]).unwrap();
            assert!(b.wait_recv(Duration::from_secs(10)).unwrap());
            assert_eq!(b.recv().unwrap().unwrap().len(), len);
            b.send(&frame[..len]).unwrap();
            assert!(a.recv().unwrap().is_some());
            // A task: loan, write, submit over the connection, receive it, complete it.
            let mut task = slots.loan().unwrap();
            task.write(&frame[..len]).unwrap();
            task.user_data_mut()[0] = 7;
            task.set_callback(done);
            let handle = task.submit(a).unwrap();
            let received = b.recv().unwrap().unwrap();
            assert_eq!(received.len(), len);
            slots
                .complete(handle, Status::Success, &frame[..len.min(64)])
                .unwrap();
            // A dropped loan goes back.
            drop(slots.loan().unwrap());
        }
        assert_eq!(a.recv().unwrap(), None);
        assert_eq!(b.recv().unwrap(), None);
    };
    // Warm up (first-use costs such as lazily initialised clocks are setup, not per frame).
    run(a, b, 100);
    let n = allocations_in(|| run(a, b, rounds));
    assert_eq!(n, 0, "{n} allocations in {rounds} rounds");
}

#[test]
fn no_allocation_per_frame_or_task() {
    // Sanity check of the counter itself.
    assert!(allocations_in(|| drop(std::hint::black_box(vec![1u8; 10]))) > 0);

    let config = ChannelConfig {
        slots: 64,
        ..ChannelConfig::default()
    };
    let (mut a, mut b) = ShmConnection::pair(&config).unwrap();
    exchange(&mut a, &mut b, 10_000);
    b.set_wait_mode(WaitMode::BusyPoll);
    exchange(&mut a, &mut b, 10_000);

    let (mut a, mut b) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 64);
    exchange(&mut a, &mut b, 10_000);
}
