//! handles
