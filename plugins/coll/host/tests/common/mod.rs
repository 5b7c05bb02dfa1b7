//! Helpers shared by the collective tests.
#![allow(dead_code)]

pub mod counting;
