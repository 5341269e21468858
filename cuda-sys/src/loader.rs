//! The driver loader: finds the driver library, resolves every symbol custody uses, checks the
//! driver version, and never panics.

use std::fmt;
use std::path::PathBuf;
use std::sync::OnceLock;

use libloading::Library;

use crate::status::CudaErrorCode;

/// The environment variable that names the driver library to load before the standard names
/// (`libcuda.so.1`, `libcuda.so`). Point it at the emulated driver (`libcuda_emu.so`) to run
/// any custody program without a GPU.
pub const DRIVER_ENV: &str = "CUSTODY_CUDA_DRIVER";

/// The oldest driver custody accepts, as `cuDriverGetVersion` reports it (12.0).
pub const MIN_DRIVER_VERSION: i32 = 12000;

const STANDARD_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// What [`LoadError::LibraryNotFound`] tells its reader to do. It names the emulated driver's
/// package (`cuda-emu/Cargo.toml`; a tidy test keeps the two in step) and the file that
/// `cargo build` leaves, since a program that failed here may have been installed without the
/// repository at hand.
const NO_DRIVER_HELP: &str = "install the NVIDIA driver, or set CUSTODY_CUDA_DRIVER to the \
     path of a CUDA driver library; to run without a GPU, point it at custody's emulated driver \
     libcuda_emu.so, which `cargo build -p cuda-custody-emu` builds from custody's source \
     repository into target/debug/libcuda_emu.so";

/// Why the driver could not be loaded.
///
/// Its `Debug` is the variant's name and its message, so that a `main` returning
/// `Result<(), Box<dyn Error>>` (which prints the error with `Debug`) shows what was tried and
/// how to name a driver or where the emulated one comes from, as `Display` does.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No candidate library could be opened; each attempt is listed as `path: reason`. The
    /// message then says how to name a driver ([`DRIVER_ENV`]) and where the emulated driver
    /// comes from, for a machine without a GPU.
    #[error(
        "no CUDA driver library could be loaded (tried {}); {NO_DRIVER_HELP}",
        .attempts.join("; ")
    )]
    LibraryNotFound {
        /// Every candidate tried, with the loader's reason.
        attempts: Vec<String>,
    },
    /// The library opened but lacks an entry point custody needs.
    #[error("the CUDA driver library {library} has no symbol {symbol}")]
    MissingSymbol {
        /// The library that was opened.
        library: String,
        /// The missing entry point.
        symbol: &'static str,
    },
    /// The driver is older than [`MIN_DRIVER_VERSION`].
    #[error(
        "the CUDA driver {library} reports version {found}; custody needs {required} or newer"
    )]
    DriverTooOld {
        /// The library that was opened.
        library: String,
        /// What `cuDriverGetVersion` reported.
        found: i32,
        /// [`MIN_DRIVER_VERSION`].
        required: i32,
    },
    /// `cuDriverGetVersion` itself failed.
    #[error("cuDriverGetVersion failed on {library}: {code}")]
    VersionQueryFailed {
        /// The library that was opened.
        library: String,
        /// The status it returned.
        code: CudaErrorCode,
    },
}

impl fmt::Debug for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let variant = match self {
            LoadError::LibraryNotFound { .. } => "LibraryNotFound",
            LoadError::MissingSymbol { .. } => "MissingSymbol",
            LoadError::DriverTooOld { .. } => "DriverTooOld",
            LoadError::VersionQueryFailed { .. } => "VersionQueryFailed",
        };
        f.debug_tuple(variant).field(&self.to_string()).finish()
    }
}

macro_rules! define_driver {
    (
        required { $($name:ident($($arg:ident: $ty:ty),* $(,)?);)* }
        optional { $($opt:ident($($oarg:ident: $oty:ty),* $(,)?);)* }
    ) => {
        /// The C signature of each driver entry point, named after the symbol.
        #[allow(non_camel_case_types, missing_docs)]
        pub mod fn_types {
            #[allow(unused_imports)]
            use crate::types::*;
            #[allow(unused_imports)]
            use crate::CUresult;
            $(pub type $name = unsafe extern "C" fn($($ty),*) -> CUresult;)*
            $(pub type $opt = unsafe extern "C" fn($($oty),*) -> CUresult;)*
        }

        /// Every driver symbol a driver must export for custody to load it, in declaration
        /// order: the entry points the product calls ([`with_driver_functions_by_need!`](crate::with_driver_functions_by_need)).
        pub const SYMBOLS: &[&str] = &[$(stringify!($name)),*];

        /// The driver symbols custody resolves when present (tests, diagnostics); a driver
        /// without one still loads.
        pub const OPTIONAL_SYMBOLS: &[&str] = &[$(stringify!($opt)),*];

        /// The resolved driver entry points, one field per symbol, named as the driver names it
        /// (`_v2` suffixes included). Call a required one as `(driver.cuMemFreeAsync)(ptr,
        /// stream)`; an optional one is `None` when the library lacks it
        /// ([`OPTIONAL_SYMBOLS`]).
        #[allow(missing_docs)]
        pub struct Driver {
            $(pub $name: fn_types::$name,)*
            $(pub $opt: Option<fn_types::$opt>,)*
            library: Library,
            path: String,
            version: i32,
        }

        impl Driver {
            fn resolve(library: Library, path: String) -> Result<Driver, LoadError> {
                $(
                    // SAFETY: the symbol's type is the C signature from cudarc's bindgen output
                    // for CUDA 12.0, with CUresult widened to u32; the pointer stays valid while
                    // `library` is loaded, and `library` is stored in the same struct.
                    let $name: fn_types::$name = unsafe {
                        match library.get::<fn_types::$name>(concat!(stringify!($name), "\0").as_bytes()) {
                            Ok(symbol) => *symbol,
                            Err(_) => {
                                return Err(LoadError::MissingSymbol {
                                    library: path,
                                    symbol: stringify!($name),
                                })
                            }
                        }
                    };
                )*
                $(
                    // SAFETY: as for the required symbols above.
                    let $opt: Option<fn_types::$opt> = unsafe {
                        library
                            .get::<fn_types::$opt>(concat!(stringify!($opt), "\0").as_bytes())
                            .ok()
                            .map(|symbol| *symbol)
                    };
                )*
                Ok(Driver { $($name,)* $($opt,)* library, path, version: 0 })
            }

            $(
                /// This entry point (required: always present once the driver loaded). With the
                /// optional ones' accessors, callers that need one can treat both alike.
                ///
                /// # Errors
                /// None; the `Result` matches the optional symbols' accessors.
                #[inline]
                pub fn $name(&self) -> Result<fn_types::$name, LoadError> {
                    Ok(self.$name)
                }
            )*

            $(
                /// This optional entry point.
                ///
                /// # Errors
                /// [`LoadError::MissingSymbol`] when the loaded library does not export it.
                #[inline]
                pub fn $opt(&self) -> Result<fn_types::$opt, LoadError> {
                    self.$opt.ok_or_else(|| LoadError::MissingSymbol {
                        library: self.path.clone(),
                        symbol: stringify!($opt),
                    })
                }
            )*
        }
    };
}

crate::with_driver_functions_by_need!(define_driver);

impl Driver {
    /// The path or name the library was opened by.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The driver version reported by `cuDriverGetVersion` (13000 for CUDA 13.0).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// Whether the loaded library is custody's emulated driver (it exports the emulator's
    /// `custodyEmuVersion`, the entry of its test interface).
    pub fn is_emulated(&self) -> bool {
        // SAFETY: only the symbol's presence is read; the pointer is never called.
        unsafe { self.extra_symbol::<*const std::ffi::c_void>(c"custodyEmuVersion") }.is_some()
    }

    /// Resolves a symbol that is not a driver entry point from the same library: the emulator's
    /// test interface (`custodyEmu*`), which the test-support crate's client calls. `None` when
    /// the library does not export it.
    ///
    /// # Safety
    /// `T` must be the symbol's true type (a function pointer of its exact C signature, or a
    /// raw pointer that is only compared); the value is valid while this `Driver` lives.
    pub unsafe fn extra_symbol<T: Copy>(&self, name: &std::ffi::CStr) -> Option<T> {
        // SAFETY: the caller guarantees `T` matches the symbol; the library outlives `self`.
        unsafe {
            self.library
                .get::<T>(name.to_bytes_with_nul())
                .ok()
                .map(|symbol| *symbol)
        }
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(path) = std::env::var_os(DRIVER_ENV).filter(|p| !p.is_empty()) {
        // An explicit path is the only candidate: silently falling back to a real driver
        // when the emulator was asked for (or the reverse) would hide a misconfiguration.
        out.push(PathBuf::from(path));
        return out;
    }
    out.extend(STANDARD_NAMES.iter().map(PathBuf::from));
    out
}

fn load() -> Result<Driver, LoadError> {
    load_from(candidates())
}

/// Loads the first of `candidates` that opens (an explicit path is the only one).
fn load_from(candidates: Vec<PathBuf>) -> Result<Driver, LoadError> {
    let mut attempts = Vec::new();
    for candidate in candidates {
        let display = candidate.display().to_string();
        // SAFETY: opening a library runs its initialisers; the CUDA driver (or the emulator)
        // is designed to be opened this way by any process.
        match unsafe { Library::new(&candidate) } {
            Ok(library) => {
                let mut driver = Driver::resolve(library, display.clone())?;
                let mut version = 0;
                // SAFETY: `version` is a valid out-pointer; read only after success.
                let status = unsafe { (driver.cuDriverGetVersion)(&mut version) };
                if status != 0 {
                    return Err(LoadError::VersionQueryFailed {
                        library: display,
                        code: CudaErrorCode(status),
                    });
                }
                if version < MIN_DRIVER_VERSION {
                    return Err(LoadError::DriverTooOld {
                        library: display,
                        found: version,
                        required: MIN_DRIVER_VERSION,
                    });
                }
                driver.version = version;
                return Ok(driver);
            }
            Err(error) => attempts.push(format!("{display}: {error}")),
        }
    }
    Err(LoadError::LibraryNotFound { attempts })
}

static DRIVER: OnceLock<Result<Driver, LoadError>> = OnceLock::new();

/// The process's driver, loaded on first use from [`DRIVER_ENV`] or the standard names.
///
/// The outcome, success or failure, is decided once per process.
///
/// # Errors
/// [`LoadError`] when no library loads, a symbol is missing, or the driver is older than 12.0.
///
/// Driver calls: `cuDriverGetVersion`.
pub fn driver() -> Result<&'static Driver, LoadError> {
    DRIVER.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// The driver's description of `code`, if a driver is loaded and knows it.
pub(crate) fn describe(code: CudaErrorCode) -> Option<String> {
    let driver = DRIVER.get()?.as_ref().ok()?;
    let mut text: *const std::ffi::c_char = std::ptr::null();
    let get_error_string = driver.cuGetErrorString?;
    // SAFETY: `text` is a valid out-pointer, read only after success.
    let status = unsafe { get_error_string(code.0, &mut text) };
    if status != 0 || text.is_null() {
        return None;
    }
    // SAFETY: on success the driver returns a NUL-terminated static string.
    let text = unsafe { std::ffi::CStr::from_ptr(text) };
    Some(text.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver that does not load says so, names the path tried, and tells the reader how to
    /// name a driver and where the emulated one comes from.
    #[test]
    fn a_missing_library_names_the_variable_and_the_emulator() {
        let missing = std::env::temp_dir().join("custody-no-such-driver/libcuda.so.1");
        let error = load_from(vec![missing.clone()]).expect_err("nothing is at that path");
        assert!(
            matches!(&error, LoadError::LibraryNotFound { attempts } if attempts.len() == 1),
            "{error:?}"
        );
        // `Debug` too: what `fn main() -> Result<(), Box<dyn Error>>` prints.
        for text in [error.to_string(), format!("{error:?}")] {
            for part in [
                &missing.display().to_string(),
                DRIVER_ENV,
                "libcuda_emu.so",
                "cargo build -p cuda-custody-emu",
            ] {
                assert!(text.contains(part), "{part:?} is not in {text:?}");
            }
        }
    }
}
