//! The task slots of a worker context: a free list of preallocated tasks.
//!
//! [`TaskSlots`] allocates everything once: per task 32 bytes of user data and a completion
//! callback, and one payload buffer that the task being written fills (only one is loaned at a
//! time, and its frame is copied out when submitted, so the buffer stays in the cache). A
//! response is lent to the callback where it lies (in the channel, for a worker's tasks), up to
//! the response size. Free slots sit on a stack (the last freed is loaned next, while its memory
//! is warm); tasks complete in any order. A task goes loan -> write -> submit -> complete:
//!
//! ```
//! use urom_host::{CompletedTask, TaskSlots};
//! use urom_transport::{Transport, loopback::LoopbackConnection};
//! use urom_wire::{MaxMsgSize, Status};
//!
//! fn done(task: &CompletedTask<'_>) {
//!     assert_eq!(task.response, b"pong");
//! }
//!
//! let (mut host, mut worker) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 8);
//! let mut slots = TaskSlots::new(4, 4096, 256).unwrap();
//! let mut task = slots.loan().unwrap();
//! task.write(b"ping").unwrap();
//! task.user_data_mut()[0] = 42;
//! task.set_callback(done);
//! let handle = task.submit(&mut host).unwrap();
//! assert_eq!(worker.recv().unwrap(), Some(&b"ping"[..]));
//! slots.complete(handle, Status::Success, b"pong").unwrap();
//! assert_eq!(slots.in_flight(), 0);
//! ```
//!
//! Dropping a loan without submitting returns its slot; [`TaskLoan::submit`] into a full
//! connection hands the loan back ([`TaskSubmitError::Full`]). [`TaskLoan::submit_or_queue`]
//! never does: a task the connection cannot take now waits in its slot's room in a queue (every
//! slot has room for one frame, so the queue holds every task the slots allow), and
//! [`TaskSlots::flush_queued`] sends the queue, in order, as the connection takes it. A queued
//! task counts as in flight. Handles are `Copy` indices with a generation, so a late or duplicate
//! completion is refused instead of completing the wrong task. Nothing here allocates after
//! [`TaskSlots::new`], which allocates the queue's room zeroed (the system maps its pages only
//! once a queued frame touches them).

use core::fmt;

use urom_transport::{FrameSendError, FrameSender, Transport};
use urom_wire::Status;

/// Bytes of user data carried by every task.
pub const USER_DATA_LEN: usize = 32;

/// Called once when a task completes.
pub type TaskCallback = fn(&CompletedTask<'_>);

/// Writes the connection's number for a frame (`seq`) into a frame
/// leaving the queue, just before it is sent ([`FrameSender::next_seq`]): the caller's frame
/// format knows where it goes.
pub type Stamp = fn(&mut [u8], u64);

/// A submitted task, as its completion callback sees it.
#[derive(Debug)]
pub struct CompletedTask<'a> {
    /// The task's handle (already free for reuse once the callback returns).
    pub handle: TaskHandle,
    /// How it ended: the worker's status, or the host's when the task failed without an
    /// answer (the worker's channel failed, or the worker was stopped).
    pub status: Status,
    /// The response bytes.
    pub response: &'a [u8],
    /// The user data written before submission.
    pub user_data: &'a [u8; USER_DATA_LEN],
}

/// Names one in-flight task. `Copy`; carries a generation so stale handles are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TaskHandle {
    index: u32,
    generation: u32,
}

impl TaskHandle {
    /// The handle as one integer, e.g. for a command's context field.
    pub fn to_u64(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    /// The handle back from [`TaskHandle::to_u64`].
    pub fn from_u64(value: u64) -> Self {
        Self {
            index: value as u32,
            generation: (value >> 32) as u32,
        }
    }

    /// The slot index.
    pub fn index(self) -> usize {
        self.index as usize
    }
}

impl fmt::Display for TaskHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {} (generation {})", self.index, self.generation)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Loaned,
    /// Submitted, waiting in the queue for room on the connection.
    Queued,
    InFlight,
}

#[derive(Clone, Copy)]
struct Meta {
    state: State,
    generation: u32,
    len: usize,
    user_data: [u8; USER_DATA_LEN],
    callback: Option<TaskCallback>,
}

/// A fixed set of task slots, allocated once.
pub struct TaskSlots {
    // INVARIANTS: `free[..free_len]` lists exactly the slots in state `Free`; `payload` holds
    // `payload_size` bytes, written by the one loan that can exist at a time; the `queue_len`
    // entries of `queue` from `queue_head` (modulo the capacity) list exactly the slots in state
    // `Queued`, in submission order, slot `i`'s frame at `queued[i * payload_size..]`.
    meta: Box<[Meta]>,
    payload: Box<[u8]>,
    payload_size: usize,
    response_size: usize,
    free: Box<[u32]>,
    free_len: usize,
    in_flight: usize,
    queued: Box<[u8]>,
    queue: Box<[u32]>,
    queue_head: usize,
    queue_len: usize,
}

/// Why task slots could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskSlotsNewError {
    /// The capacity is zero, not a power of two, or above 2^31, or room for a frame per slot
    /// would not fit the address space.
    Capacity(usize),
}

impl fmt::Display for TaskSlotsNewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskSlotsNewError::Capacity(n) => {
                write!(f, "{n} task slots is not a power of two between 1 and 2^31")
            }
        }
    }
}

impl core::error::Error for TaskSlotsNewError {}

/// No task slot is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskLoanError {
    /// Every slot is loaned or in flight; complete some tasks first.
    Exhausted {
        /// The number of slots.
        capacity: usize,
    },
}

impl fmt::Display for TaskLoanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskLoanError::Exhausted { capacity } => write!(
                f,
                "all {capacity} task slots are in use; progress to complete tasks, or raise max in-flight tasks"
            ),
        }
    }
}

impl core::error::Error for TaskLoanError {}

/// The payload does not fit the task's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskWriteError {
    /// Bytes offered.
    pub len: usize,
    /// Bytes the buffer holds.
    pub capacity: usize,
}

impl fmt::Display for TaskWriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "task payload of {} bytes exceeds the task buffer of {} bytes",
            self.len, self.capacity
        )
    }
}

impl core::error::Error for TaskWriteError {}

/// Why a task was not submitted.
pub enum TaskSubmitError<'r> {
    /// The connection is full: here is the task back, unchanged; submit it again later.
    Full(TaskLoan<'r>),
    /// The connection failed; the task's slot is free again.
    Send(FrameSendError),
}

impl fmt::Debug for TaskSubmitError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskSubmitError::Full(loan) => f.debug_tuple("Full").field(&loan.index).finish(),
            TaskSubmitError::Send(e) => f.debug_tuple("Send").field(e).finish(),
        }
    }
}

impl fmt::Display for TaskSubmitError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskSubmitError::Full(_) => {
                f.write_str("connection to the worker is full; the task was handed back")
            }
            TaskSubmitError::Send(e) => write!(f, "task not submitted: {e}"),
        }
    }
}

impl core::error::Error for TaskSubmitError<'_> {}

/// Why a completion was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskCompleteError {
    /// The handle names no task in flight (already completed, or never submitted).
    NotInFlight(TaskHandle),
    /// The response is longer than the task's response space; the task stays in flight.
    ResponseTooLarge {
        /// Bytes offered.
        len: usize,
        /// Bytes of response space.
        capacity: usize,
    },
}

impl fmt::Display for TaskCompleteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskCompleteError::NotInFlight(h) => {
                write!(f, "completion for {h} which is not in flight")
            }
            TaskCompleteError::ResponseTooLarge { len, capacity } => write!(
                f,
                "response of {len} bytes exceeds the task's response space of {capacity} bytes"
            ),
        }
    }
}

impl core::error::Error for TaskCompleteError {}

impl TaskSlots {
    /// `capacity` task slots (a power of two) for payloads of up to `payload_size` bytes and
    /// responses of up to `response_size` bytes, with room to queue a frame per slot. The only
    /// allocation they ever make.
    pub fn new(
        capacity: usize,
        payload_size: usize,
        response_size: usize,
    ) -> Result<Self, TaskSlotsNewError> {
        let room = capacity
            .checked_mul(payload_size)
            .filter(|room| *room <= isize::MAX as usize);
        if !capacity.is_power_of_two() || capacity > 1 << 31 || room.is_none() {
            return Err(TaskSlotsNewError::Capacity(capacity));
        }
        let meta = Meta {
            state: State::Free,
            generation: 0,
            len: 0,
            user_data: [0; USER_DATA_LEN],
            callback: None,
        };
        Ok(Self {
            meta: vec![meta; capacity].into_boxed_slice(),
            payload: vec![0; payload_size].into_boxed_slice(),
            payload_size,
            response_size,
            // Popped from the end: slot 0 first.
            free: (0..capacity as u32).rev().collect(),
            free_len: capacity,
            in_flight: 0,
            // Zeroed, so that the system maps the pages only once a queued frame touches them.
            queued: vec![0; room.unwrap_or(0)].into_boxed_slice(),
            queue: vec![0; capacity].into_boxed_slice(),
            queue_head: 0,
            queue_len: 0,
        })
    }

    /// Number of task slots.
    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Tasks submitted and not yet completed (queued ones included).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Tasks submitted that wait in the queue for room on the connection.
    pub fn queued(&self) -> usize {
        self.queue_len
    }

    /// Sends queued tasks, oldest first, as long as `conn` takes them, each stamped with
    /// `stamp` and the connection's number for it; returns how many went. A connection that
    /// fails stops the flush (the tasks still queued complete with the failure, through
    /// [`TaskSlots::fail_in_flight`]).
    #[inline]
    pub fn flush_queued(
        &mut self,
        conn: &mut (impl Transport + ?Sized),
        stamp: Stamp,
    ) -> Result<usize, FrameSendError> {
        let mask = self.capacity() - 1;
        let mut sent = 0;
        let (tx, _) = conn.split();
        while self.queue_len > 0 {
            let index = self.queue[self.queue_head] as usize;
            let len = self.meta[index].len;
            let start = index * self.payload_size;
            let frame = &mut self.queued[start..start + len];
            stamp(frame, tx.next_seq());
            match tx.send(frame) {
                Ok(()) => {
                    self.meta[index].state = State::InFlight;
                    self.queue_head = (self.queue_head + 1) & mask;
                    self.queue_len -= 1;
                    sent += 1;
                }
                Err(FrameSendError::Full) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }

    /// Takes a free slot to fill in.
    pub fn loan(&mut self) -> Result<TaskLoan<'_>, TaskLoanError> {
        if self.free_len == 0 {
            return Err(TaskLoanError::Exhausted {
                capacity: self.capacity(),
            });
        }
        self.free_len -= 1;
        let index = self.free[self.free_len] as usize;
        let meta = &mut self.meta[index];
        meta.state = State::Loaned;
        meta.len = 0;
        meta.user_data = [0; USER_DATA_LEN];
        meta.callback = None;
        Ok(TaskLoan { slots: self, index })
    }

    /// Completes the in-flight task `handle`: frees it and runs its callback, which sees
    /// `response`.
    #[inline]
    pub fn complete(
        &mut self,
        handle: TaskHandle,
        status: Status,
        response: &[u8],
    ) -> Result<(), TaskCompleteError> {
        let index = handle.index as usize;
        match self.meta.get(index) {
            Some(m) if m.state == State::InFlight && m.generation == handle.generation => {}
            _ => return Err(TaskCompleteError::NotInFlight(handle)),
        }
        if response.len() > self.response_size {
            return Err(TaskCompleteError::ResponseTooLarge {
                len: response.len(),
                capacity: self.response_size,
            });
        }
        let meta = &mut self.meta[index];
        meta.state = State::Free;
        meta.generation = meta.generation.wrapping_add(1);
        let (callback, user_data) = (meta.callback, meta.user_data);
        self.free[self.free_len] = index as u32;
        self.free_len += 1;
        self.in_flight -= 1;
        if let Some(callback) = callback {
            callback(&CompletedTask {
                handle,
                status,
                response,
                user_data: &user_data,
            });
        }
        Ok(())
    }

    /// Completes every in-flight task, queued ones included, with `status` and an empty
    /// response (the worker is gone); returns how many there were. Each callback runs once.
    pub fn fail_in_flight(&mut self, status: Status) -> usize {
        let mut failed = 0;
        self.queue_len = 0;
        for index in 0..self.meta.len() {
            if self.meta[index].state == State::Queued {
                self.meta[index].state = State::InFlight;
            }
            if self.meta[index].state == State::InFlight {
                let handle = TaskHandle {
                    index: index as u32,
                    generation: self.meta[index].generation,
                };
                if self.complete(handle, status, &[]).is_ok() {
                    failed += 1;
                }
            }
        }
        failed
    }

    fn give_back(&mut self, index: usize) {
        self.meta[index].state = State::Free;
        self.free[self.free_len] = index as u32;
        self.free_len += 1;
    }
}

/// A loaned task slot: fill it in, then [`TaskLoan::submit`]. Dropping it returns the slot.
pub struct TaskLoan<'r> {
    slots: &'r mut TaskSlots,
    index: usize,
}

impl<'r> TaskLoan<'r> {
    /// The handle the task will have once submitted.
    pub fn handle(&self) -> TaskHandle {
        TaskHandle {
            index: self.index as u32,
            generation: self.slots.meta[self.index].generation,
        }
    }

    /// The whole payload buffer; say how much of it to send with [`TaskLoan::set_len`].
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.slots.payload
    }

    /// Sets how many payload bytes to send (at most the buffer's size).
    pub fn set_len(&mut self, len: usize) -> Result<(), TaskWriteError> {
        if len > self.slots.payload_size {
            return Err(TaskWriteError {
                len,
                capacity: self.slots.payload_size,
            });
        }
        self.slots.meta[self.index].len = len;
        Ok(())
    }

    /// Copies `payload` into the buffer and sets the length.
    pub fn write(&mut self, payload: &[u8]) -> Result<(), TaskWriteError> {
        self.set_len(payload.len())?;
        self.payload_mut()[..payload.len()].copy_from_slice(payload);
        Ok(())
    }

    /// The task's 32 bytes of user data (zero when loaned).
    pub fn user_data_mut(&mut self) -> &mut [u8; USER_DATA_LEN] {
        &mut self.slots.meta[self.index].user_data
    }

    /// The function to call when the task completes.
    pub fn set_callback(&mut self, callback: TaskCallback) {
        self.slots.meta[self.index].callback = Some(callback);
    }

    /// Sends the payload on `conn` and puts the task in flight.
    pub fn submit(
        self,
        conn: &mut (impl Transport + ?Sized),
    ) -> Result<TaskHandle, TaskSubmitError<'r>> {
        let loan = self;
        let index = loan.index;
        let len = loan.slots.meta[index].len;
        match conn.send(&loan.slots.payload[..len]) {
            Ok(()) => {
                let handle = loan.handle();
                loan.slots.meta[index].state = State::InFlight;
                loan.slots.in_flight += 1;
                core::mem::forget(loan);
                Ok(handle)
            }
            Err(FrameSendError::Full) => Err(TaskSubmitError::Full(loan)),
            Err(e) => Err(TaskSubmitError::Send(e)),
        }
    }
}

impl<'r> TaskLoan<'r> {
    /// Sends the payload on `conn`, or queues it when the connection cannot take it now or
    /// tasks queued before it still wait (sent first, in order: [`TaskSlots::flush_queued`]
    /// with `stamp`). Either way the task is in flight; only a failed connection refuses it
    /// (its slot is free again). The payload is copied into the slot's room only when queued.
    #[inline]
    pub fn submit_or_queue(
        self,
        conn: &mut (impl Transport + ?Sized),
        stamp: Stamp,
    ) -> Result<TaskHandle, FrameSendError> {
        if self.slots.queue_len > 0 {
            self.slots.flush_queued(conn, stamp)?;
        }
        let index = self.index;
        let len = self.slots.meta[index].len;
        if self.slots.queue_len == 0 {
            match conn.send(&self.slots.payload[..len]) {
                Ok(()) => {
                    let handle = self.handle();
                    self.slots.meta[index].state = State::InFlight;
                    self.slots.in_flight += 1;
                    core::mem::forget(self);
                    return Ok(handle);
                }
                Err(FrameSendError::Full) => {}
                Err(e) => return Err(e),
            }
        }
        let handle = self.handle();
        let slots = &mut *self.slots;
        let start = index * slots.payload_size;
        slots.queued[start..start + len].copy_from_slice(&slots.payload[..len]);
        let mask = slots.meta.len() - 1;
        slots.queue[(slots.queue_head + slots.queue_len) & mask] = index as u32;
        slots.queue_len += 1;
        slots.meta[index].state = State::Queued;
        slots.in_flight += 1;
        core::mem::forget(self);
        Ok(handle)
    }
}

impl Drop for TaskLoan<'_> {
    fn drop(&mut self) {
        self.slots.give_back(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use urom_transport::loopback::LoopbackConnection;
    use urom_wire::MaxMsgSize;

    static LAST: AtomicU64 = AtomicU64::new(0);

    fn record(task: &CompletedTask<'_>) {
        let mut v = [0u8; 8];
        v.copy_from_slice(&task.user_data[..8]);
        LAST.store(
            u64::from_le_bytes(v) + task.response.len() as u64,
            Ordering::Relaxed,
        );
    }

    #[test]
    fn capacity_must_be_a_power_of_two() {
        assert!(TaskSlots::new(0, 8, 8).is_err());
        assert!(TaskSlots::new(3, 8, 8).is_err());
        assert!(TaskSlots::new(4, 8, 8).is_ok());
    }

    #[test]
    fn loan_write_submit_complete() {
        let (mut host, mut worker) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 8);
        let mut slots = TaskSlots::new(2, 64, 16).unwrap();
        let mut loan = slots.loan().unwrap();
        loan.write(b"abc").unwrap();
        loan.user_data_mut()[..8].copy_from_slice(&1000u64.to_le_bytes());
        loan.set_callback(record);
        let handle = loan.submit(&mut host).unwrap();
        assert_eq!(slots.in_flight(), 1);
        assert_eq!(worker.recv().unwrap(), Some(&b"abc"[..]));
        slots.complete(handle, Status::Success, b"hello").unwrap();
        assert_eq!(LAST.load(Ordering::Relaxed), 1005);
        assert_eq!(slots.in_flight(), 0);
        // A second completion of the same handle is refused.
        assert_eq!(
            slots.complete(handle, Status::Success, b""),
            Err(TaskCompleteError::NotInFlight(handle))
        );
    }

    #[test]
    fn dropped_loan_returns_its_slot() {
        let mut slots = TaskSlots::new(1, 8, 8).unwrap();
        drop(slots.loan().unwrap());
        let loan = slots.loan().unwrap();
        assert_eq!(loan.handle().index(), 0);
    }

    #[test]
    fn exhausted_slots_refuse_a_loan() {
        let (mut host, _worker) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 8);
        let mut slots = TaskSlots::new(2, 8, 8).unwrap();
        let a = slots.loan().unwrap().submit(&mut host).unwrap();
        slots.loan().unwrap().submit(&mut host).unwrap();
        assert_eq!(
            slots.loan().err(),
            Some(TaskLoanError::Exhausted { capacity: 2 })
        );
        slots.complete(a, Status::Success, b"").unwrap();
        assert!(slots.loan().is_ok());
    }

    #[test]
    fn full_connection_hands_the_task_back() {
        let (mut host, mut worker) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 1);
        let mut slots = TaskSlots::new(4, 8, 8).unwrap();
        slots.loan().unwrap().submit(&mut host).unwrap();
        let mut loan = slots.loan().unwrap();
        loan.write(b"second").unwrap();
        let loan = match loan.submit(&mut host) {
            Err(TaskSubmitError::Full(loan)) => loan,
            other => panic!("expected Full, got {other:?}"),
        };
        worker.recv().unwrap();
        loan.submit(&mut host).unwrap();
        assert_eq!(worker.recv().unwrap(), Some(&b"second"[..]));
        assert_eq!(slots.in_flight(), 2);
    }

    /// Stamps a queued frame's first byte with its number on the connection.
    fn stamp_first(frame: &mut [u8], seq: u64) {
        frame[0] = seq as u8;
    }

    #[test]
    fn a_full_connection_queues_tasks_and_sends_them_in_order() {
        let (mut host, mut worker) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 2);
        let mut slots = TaskSlots::new(8, 8, 8).unwrap();
        let mut handles = Vec::new();
        for i in 0..6u8 {
            let mut loan = slots.loan().unwrap();
            loan.write(&[0, i]).unwrap();
            handles.push(loan.submit_or_queue(&mut host, stamp_first).unwrap());
        }
        assert_eq!((slots.in_flight(), slots.queued()), (6, 4));
        // A queued task cannot be completed: it was never sent.
        assert!(slots.complete(handles[2], Status::Success, b"").is_err());
        let mut seen = Vec::new();
        while seen.len() < 6 {
            while let Some(frame) = worker.recv().unwrap() {
                seen.push(frame[1]);
            }
            slots.flush_queued(&mut host, stamp_first).unwrap();
        }
        assert_eq!(seen, [0, 1, 2, 3, 4, 5], "sent in submission order");
        assert_eq!(slots.queued(), 0);
        for handle in handles {
            slots.complete(handle, Status::Success, b"").unwrap();
        }
        assert_eq!(slots.in_flight(), 0);
    }

    #[test]
    fn a_task_submitted_behind_queued_ones_waits_its_turn() {
        let (mut host, mut worker) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 1);
        let mut slots = TaskSlots::new(4, 8, 8).unwrap();
        for i in 0..2u8 {
            let mut loan = slots.loan().unwrap();
            loan.write(&[0, i]).unwrap();
            loan.submit_or_queue(&mut host, stamp_first).unwrap();
        }
        // Room for one: the queued task goes first, the new one queues behind it.
        assert_eq!(worker.recv().unwrap().map(|f| f[1]), Some(0));
        let mut loan = slots.loan().unwrap();
        loan.write(&[0, 2]).unwrap();
        loan.submit_or_queue(&mut host, stamp_first).unwrap();
        assert_eq!(slots.queued(), 1);
        let frame = worker.recv().unwrap().unwrap().to_vec();
        assert_eq!(frame[1], 1);
        slots.flush_queued(&mut host, stamp_first).unwrap();
        assert_eq!(worker.recv().unwrap().map(|f| f[1]), Some(2));
    }

    static FAILED: AtomicU64 = AtomicU64::new(0);

    fn count_failure(task: &CompletedTask<'_>) {
        assert_eq!(task.status, Status::NotConnected);
        FAILED.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn failing_completes_queued_tasks_once() {
        let (mut host, _worker) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 1);
        let mut slots = TaskSlots::new(4, 8, 8).unwrap();
        for _ in 0..4 {
            let mut loan = slots.loan().unwrap();
            loan.write(b"x").unwrap();
            loan.set_callback(count_failure);
            loan.submit_or_queue(&mut host, stamp_first).unwrap();
        }
        assert_eq!(slots.queued(), 3);
        assert!(slots.loan().is_err(), "queued tasks hold their slots");
        assert_eq!(slots.fail_in_flight(Status::NotConnected), 4);
        assert_eq!(FAILED.load(Ordering::Relaxed), 4);
        assert_eq!((slots.in_flight(), slots.queued()), (0, 0));
        assert!(slots.loan().is_ok());
    }

    #[test]
    fn oversized_payload_and_response_are_refused() {
        let (mut host, _worker) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 1);
        let mut slots = TaskSlots::new(1, 4, 2).unwrap();
        let mut loan = slots.loan().unwrap();
        assert_eq!(
            loan.write(b"12345"),
            Err(TaskWriteError {
                len: 5,
                capacity: 4
            })
        );
        let h = loan.submit(&mut host).unwrap();
        assert!(matches!(
            slots.complete(h, Status::Success, b"abc"),
            Err(TaskCompleteError::ResponseTooLarge { .. })
        ));
        slots.complete(h, Status::Success, b"ab").unwrap();
    }
}
