//! The emulated CUDA driver.
