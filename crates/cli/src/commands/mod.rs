//! One module per command area. Each holds its flags (clap), turns them into the library's
//! settings, calls the library, and prints or writes what comes back.

pub mod admin;
pub mod bench_load_gen;
pub mod bench_ring;
pub mod cdr;
pub mod delivery;
pub mod demo;
pub mod exchange;
pub mod exchange_roles;
pub mod exchange_serve;
pub mod journal;
pub mod mq;
pub mod planner;
pub mod replication;
pub mod reproduce;
pub mod sim;
pub mod tier_report;
pub mod timeouts;
pub mod values;
pub mod web;
pub mod web_lab;
