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
//! Dropping a loan without submitting returns its slot; submitting into a full connection hands
//! the loan back ([`TaskSubmitError::Full`]). Handles are `Copy` indices with a generation, so a
//! late or duplicate completion is refused instead of completing the wrong task. Nothing here
//! allocates after [`TaskSlots::new`].

use core::fmt;

use urom_transport::{FrameSendError, Transport};
use urom_wire::Status;

/// Bytes of user data carried by every task.
pub const USER_DATA_LEN: usize = 32;

/// Called once when a task completes.
pub type TaskCallback = fn(&CompletedTask<'_>);

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
    // `payload_size` bytes, written by the one loan that can exist at a time.
    meta: Box<[Meta]>,
    payload: Box<[u8]>,
    payload_size: usize,
    response_size: usize,
    free: Box<[u32]>,
    free_len: usize,
    in_flight: usize,
}

/// Why task slots could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskSlotsNewError {
    /// The capacity is zero, not a power of two, or above 2^31.
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
    /// responses of up to `response_size` bytes. The only allocation they ever make.
    pub fn new(
        capacity: usize,
        payload_size: usize,
        response_size: usize,
    ) -> Result<Self, TaskSlotsNewError> {
        if !capacity.is_power_of_two() || capacity > 1 << 31 {
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
        })
    }

    /// Number of task slots.
    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Tasks submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
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

    /// Completes every in-flight task with `status` and an empty response (the worker is
    /// gone); returns how many there were. Each callback runs once.
    pub fn fail_in_flight(&mut self, status: Status) -> usize {
        let mut failed = 0;
        for index in 0..self.meta.len() {
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
