//! The progress engine.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

/// A context the engine polls.
pub(crate) trait Poll {
    /// Does what is ready (receive, complete tasks, run callbacks); returns how much.
    fn poll(&mut self) -> usize;
}

/// A task the engine owns until it completes (control-path queries).
pub(crate) trait OneShot {
    /// Completes the task when its answer is there; `true` once done.
    fn poll(&mut self) -> bool;
}

/// Polls the contexts connected to it. Single-threaded: create one per thread.
#[derive(Default)]
pub struct ProgressEngine {
    contexts: Vec<Weak<RefCell<dyn Poll>>>,
    tasks: Vec<Box<dyn OneShot>>,
}

impl ProgressEngine {
    /// An engine with no context.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn connect(&mut self, context: &Rc<RefCell<dyn Poll>>) {
        self.contexts.push(Rc::downgrade(context));
    }

    pub(crate) fn add_task(&mut self, task: Box<dyn OneShot>) {
        self.tasks.push(task);
    }

    /// Polls every connected context once; returns how much work was done (frames received,
    /// tasks completed). Contexts that were dropped are disconnected.
    pub fn progress(&mut self) -> usize {
        let mut work = 0;
        self.contexts.retain(|context| match context.upgrade() {
            Some(context) => {
                // A callback that progresses the same engine would re-enter; it is skipped.
                if let Ok(mut context) = context.try_borrow_mut() {
                    work += context.poll();
                }
                true
            }
            None => false,
        });
        let before = self.tasks.len();
        self.tasks.retain_mut(|task| !task.poll());
        work + (before - self.tasks.len())
    }
}
