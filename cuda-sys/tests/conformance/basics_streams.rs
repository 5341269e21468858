//! Basics: created streams (flags, priority, context), default-stream tokens, host functions,
//! events and stream waits.

use std::sync::Arc;

use cuda_sys::types::{CU_STREAM_LEGACY, CU_STREAM_NULL, CU_STREAM_PER_THREAD};
use cuda_sys::CudaErrorCode;

use crate::driver::{
    ctx_create, ctx_destroy, ctx_get_current, event_create, event_destroy, event_query,
    event_record, event_synchronize, init, launch_host_func, stream_create,
    stream_create_with_priority, stream_destroy, stream_get_ctx, stream_get_flags,
    stream_get_priority, stream_query, stream_synchronize, stream_wait_event, EVENT_DISABLE_TIMING,
    STREAM_NON_BLOCKING,
};
use crate::support::{
    block_stream, device0, on_fresh_thread, position, primary_current, Primary, Probe,
};

#[test]
fn basic_stream_create_flags_and_context() {
    on_fresh_thread("stream-flags", || {
        init();
        let primary = primary_current();
        let blocking = stream_create(0).check();
        let non_blocking = stream_create(STREAM_NON_BLOCKING).check();
        assert!(!blocking.is_null() && !non_blocking.is_null());
        assert_ne!(blocking, non_blocking);
        assert_eq!(stream_get_flags(blocking).check(), 0);
        assert_eq!(stream_get_flags(non_blocking).check(), STREAM_NON_BLOCKING);
        assert_eq!(stream_get_ctx(blocking).check(), primary.ctx());
        assert_eq!(stream_get_ctx(non_blocking).check(), primary.ctx());
        stream_query(blocking).check(); // an idle stream is complete
        stream_synchronize(blocking).check();
        stream_destroy(blocking).check();
        stream_destroy(non_blocking).check();
    });
}

#[test]
fn basic_stream_create_with_priority() {
    on_fresh_thread("stream-priority", || {
        init();
        let _primary = primary_current();
        // 0 is the default (lowest) priority on every device; -1 is inside the range of every
        // device that supports priorities (Hopper: 0 to -5).
        let low = stream_create_with_priority(STREAM_NON_BLOCKING, 0).check();
        let high = stream_create_with_priority(STREAM_NON_BLOCKING, -1).check();
        assert_eq!(stream_get_priority(low).check(), 0);
        assert_eq!(stream_get_priority(high).check(), -1);
        assert_eq!(stream_get_flags(high).check(), STREAM_NON_BLOCKING);
        stream_destroy(low).check();
        stream_destroy(high).check();
    });
}

#[test]
fn basic_stream_get_ctx_of_created_context_stream() {
    on_fresh_thread("stream-created-ctx", || {
        init();
        let primary = primary_current();
        let c = ctx_create(device0()).check();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        assert_eq!(
            stream_get_ctx(s).check(),
            c,
            "a stream belongs to the context current at creation"
        );
        assert_ne!(c, primary.ctx());
        stream_destroy(s).check();
        ctx_destroy(c).check();
        assert_eq!(ctx_get_current().check(), primary.ctx());
    });
}

#[test]
fn basic_default_stream_tokens_resolve_against_current_context() {
    on_fresh_thread("tokens", || {
        init();
        let primary = primary_current();
        for token in [CU_STREAM_NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD] {
            assert_eq!(
                stream_get_ctx(token).check(),
                primary.ctx(),
                "token {token:?}"
            );
            stream_synchronize(token).check();
            stream_query(token).check();
        }
    });
}

#[test]
fn basic_default_stream_tokens_need_a_current_context() {
    init();
    // Retained on the test thread (retaining binds no context), current on no thread.
    let _primary = Primary::retain();
    on_fresh_thread("no-context", || {
        init();
        for token in [CU_STREAM_NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD] {
            stream_synchronize(token).fails_with(CudaErrorCode::INVALID_CONTEXT);
            stream_get_ctx(token).fails_with(CudaErrorCode::INVALID_CONTEXT);
        }
    });
}

#[test]
fn basic_host_functions_run_in_stream_order_on_a_driver_thread() {
    on_fresh_thread("host-fn", || {
        init();
        let _primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let probe = Probe::new();
        for label in ["first", "second", "third"] {
            let probe = Arc::clone(&probe);
            launch_host_func(s, move || probe.mark(label)).check();
        }
        stream_synchronize(s).check();
        assert_eq!(probe.labels(), ["first", "second", "third"]);
        let me = std::thread::current().id();
        for mark in probe.marks() {
            assert_ne!(
                mark.thread, me,
                "host function {} ran on the caller",
                mark.label
            );
        }
        stream_destroy(s).check();
    });
}

#[test]
fn basic_event_record_query_synchronize() {
    on_fresh_thread("event", || {
        init();
        let _primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let e = event_create(EVENT_DISABLE_TIMING).check();
        event_query(e).check(); // never recorded: complete
        event_record(e, s).check();
        event_synchronize(e).check();
        event_query(e).check();
        event_destroy(e).check();
        stream_destroy(s).check();
    });
}

#[test]
fn basic_event_and_stream_not_ready_behind_blocked_host_function() {
    on_fresh_thread("event-not-ready", || {
        init();
        let _primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let e = event_create(EVENT_DISABLE_TIMING).check();
        let probe = Probe::new();
        block_stream(s, &probe).check();
        event_record(e, s).check();
        // The host function cannot return before the gate opens, so both are pending.
        event_query(e).fails_with(CudaErrorCode::NOT_READY);
        stream_query(s).fails_with(CudaErrorCode::NOT_READY);
        probe.open_gate();
        event_synchronize(e).check();
        event_query(e).check();
        stream_synchronize(s).check();
        stream_query(s).check();
        assert_eq!(probe.labels(), ["gate_entered", "gate_released"]);
        event_destroy(e).check();
        stream_destroy(s).check();
    });
}

#[test]
fn basic_stream_wait_event_orders_other_stream() {
    on_fresh_thread("wait-event", || {
        init();
        let _primary = primary_current();
        let producer = stream_create(STREAM_NON_BLOCKING).check();
        let consumer = stream_create(STREAM_NON_BLOCKING).check();
        let e = event_create(EVENT_DISABLE_TIMING).check();
        let probe = Probe::new();
        block_stream(producer, &probe).check();
        event_record(e, producer).check();
        stream_wait_event(consumer, e).check();
        let consumer_probe = Arc::clone(&probe);
        launch_host_func(consumer, move || consumer_probe.mark("consumer")).check();
        // The consumer's host function waits on an event behind the closed gate.
        stream_query(consumer).fails_with(CudaErrorCode::NOT_READY);
        probe.open_gate();
        stream_synchronize(consumer).check();
        let labels = probe.labels();
        assert!(
            position(&labels, "gate_released") < position(&labels, "consumer"),
            "the consumer ran before the event it waits on: {labels:?}"
        );
        stream_synchronize(producer).check();
        event_destroy(e).check();
        stream_destroy(producer).check();
        stream_destroy(consumer).check();
    });
}
