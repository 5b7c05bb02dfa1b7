//! After setup, sending, receiving and the task slots allocate nothing: a counting global
//! allocator watches this test's thread while it moves frames and tasks.

use std::time::Duration;

mod common;

use urom_host::{CompletedTask, TaskSlots};
use urom_testkit::counting::{Counting, allocations_in};
use urom_transport::ChannelConfig;
use urom_transport::loopback::LoopbackConnection;
use urom_transport::shm::ShmConnection;
use urom_transport::{Transport, WaitMode};
use urom_wire::{MaxMsgSize, Status};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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
