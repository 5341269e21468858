"""``DeviceProperties``: a device's attributes under cuda.core 1.2's names.

Each property reads one ``CU_DEVICE_ATTRIBUTE_*`` with ``cuDeviceGetAttribute`` (no context need
be current) the first time it is read, and keeps the value: attributes do not change while the
process runs. The table gives each name, its attribute's number in the CUDA headers, and whether
it reads as a ``bool`` or an ``int``. Attributes newer than the loaded driver raise
:class:`custody.CUDAError` (``CUDA_ERROR_INVALID_VALUE``) when read.
"""

from __future__ import annotations

from custody import _custody

# (name, CUdevice_attribute number, type): cuda.core 1.2's DeviceProperties, in its order.
ATTRIBUTES = (
    ("max_threads_per_block", 1, int),
    ("max_block_dim_x", 2, int),
    ("max_block_dim_y", 3, int),
    ("max_block_dim_z", 4, int),
    ("max_grid_dim_x", 5, int),
    ("max_grid_dim_y", 6, int),
    ("max_grid_dim_z", 7, int),
    ("max_shared_memory_per_block", 8, int),
    ("total_constant_memory", 9, int),
    ("warp_size", 10, int),
    ("max_pitch", 11, int),
    ("maximum_texture1d_width", 21, int),
    ("maximum_texture1d_linear_width", 69, int),
    ("maximum_texture1d_mipmapped_width", 77, int),
    ("maximum_texture2d_width", 22, int),
    ("maximum_texture2d_height", 23, int),
    ("maximum_texture2d_linear_width", 70, int),
    ("maximum_texture2d_linear_height", 71, int),
    ("maximum_texture2d_linear_pitch", 72, int),
    ("maximum_texture2d_mipmapped_width", 73, int),
    ("maximum_texture2d_mipmapped_height", 74, int),
    ("maximum_texture3d_width", 24, int),
    ("maximum_texture3d_height", 25, int),
    ("maximum_texture3d_depth", 26, int),
    ("maximum_texture3d_width_alternate", 47, int),
    ("maximum_texture3d_height_alternate", 48, int),
    ("maximum_texture3d_depth_alternate", 49, int),
    ("maximum_texturecubemap_width", 52, int),
    ("maximum_texture1d_layered_width", 42, int),
    ("maximum_texture1d_layered_layers", 43, int),
    ("maximum_texture2d_layered_width", 27, int),
    ("maximum_texture2d_layered_height", 28, int),
    ("maximum_texture2d_layered_layers", 29, int),
    ("maximum_texturecubemap_layered_width", 53, int),
    ("maximum_texturecubemap_layered_layers", 54, int),
    ("maximum_surface1d_width", 55, int),
    ("maximum_surface2d_width", 56, int),
    ("maximum_surface2d_height", 57, int),
    ("maximum_surface3d_width", 58, int),
    ("maximum_surface3d_height", 59, int),
    ("maximum_surface3d_depth", 60, int),
    ("maximum_surface1d_layered_width", 61, int),
    ("maximum_surface1d_layered_layers", 62, int),
    ("maximum_surface2d_layered_width", 63, int),
    ("maximum_surface2d_layered_height", 64, int),
    ("maximum_surface2d_layered_layers", 65, int),
    ("maximum_surfacecubemap_width", 66, int),
    ("maximum_surfacecubemap_layered_width", 67, int),
    ("maximum_surfacecubemap_layered_layers", 68, int),
    ("max_registers_per_block", 12, int),
    ("clock_rate", 13, int),
    ("texture_alignment", 14, int),
    ("texture_pitch_alignment", 51, int),
    ("gpu_overlap", 15, bool),
    ("multiprocessor_count", 16, int),
    ("kernel_exec_timeout", 17, bool),
    ("integrated", 18, bool),
    ("can_map_host_memory", 19, bool),
    ("compute_mode", 20, int),
    ("concurrent_kernels", 31, bool),
    ("ecc_enabled", 32, bool),
    ("pci_bus_id", 33, int),
    ("pci_device_id", 34, int),
    ("pci_domain_id", 50, int),
    ("tcc_driver", 35, bool),
    ("memory_clock_rate", 36, int),
    ("global_memory_bus_width", 37, int),
    ("l2_cache_size", 38, int),
    ("max_threads_per_multiprocessor", 39, int),
    ("unified_addressing", 41, bool),
    ("compute_capability_major", 75, int),
    ("compute_capability_minor", 76, int),
    ("global_l1_cache_supported", 79, bool),
    ("local_l1_cache_supported", 80, bool),
    ("max_shared_memory_per_multiprocessor", 81, int),
    ("max_registers_per_multiprocessor", 82, int),
    ("managed_memory", 83, bool),
    ("multi_gpu_board", 84, bool),
    ("multi_gpu_board_group_id", 85, int),
    ("host_native_atomic_supported", 86, bool),
    ("single_to_double_precision_perf_ratio", 87, int),
    ("pageable_memory_access", 88, bool),
    ("concurrent_managed_access", 89, bool),
    ("compute_preemption_supported", 90, bool),
    ("can_use_host_pointer_for_registered_mem", 91, bool),
    ("cooperative_launch", 95, bool),
    ("max_shared_memory_per_block_optin", 97, int),
    ("pageable_memory_access_uses_host_page_tables", 100, bool),
    ("direct_managed_mem_access_from_host", 101, bool),
    ("virtual_memory_management_supported", 102, bool),
    ("handle_type_posix_file_descriptor_supported", 103, bool),
    ("handle_type_win32_handle_supported", 104, bool),
    ("handle_type_win32_kmt_handle_supported", 105, bool),
    ("max_blocks_per_multiprocessor", 106, int),
    ("generic_compression_supported", 107, bool),
    ("max_persisting_l2_cache_size", 108, int),
    ("max_access_policy_window_size", 109, int),
    ("gpu_direct_rdma_with_cuda_vmm_supported", 110, bool),
    ("reserved_shared_memory_per_block", 111, int),
    ("sparse_cuda_array_supported", 112, bool),
    ("read_only_host_register_supported", 113, bool),
    ("memory_pools_supported", 115, bool),
    ("gpu_direct_rdma_supported", 116, bool),
    ("gpu_direct_rdma_flush_writes_options", 117, int),
    ("gpu_direct_rdma_writes_ordering", 118, int),
    ("mempool_supported_handle_types", 119, int),
    ("deferred_mapping_cuda_array_supported", 121, bool),
    ("surface_alignment", 30, int),
    ("async_engine_count", 40, int),
    ("can_tex2d_gather", 44, bool),
    ("maximum_texture2d_gather_width", 45, int),
    ("maximum_texture2d_gather_height", 46, int),
    ("stream_priorities_supported", 78, bool),
    ("can_flush_remote_writes", 98, bool),
    ("host_register_supported", 99, bool),
    ("timeline_semaphore_interop_supported", 114, bool),
    ("cluster_launch", 120, bool),
    ("can_use_64_bit_stream_mem_ops", 122, bool),
    ("can_use_stream_wait_value_nor", 123, bool),
    ("dma_buf_supported", 124, bool),
    ("ipc_event_supported", 125, bool),
    ("mem_sync_domain_count", 126, int),
    ("tensor_map_access_supported", 127, bool),
    ("handle_type_fabric_supported", 128, bool),
    ("unified_function_pointers", 129, bool),
    ("numa_config", 130, int),
    ("numa_id", 131, int),
    ("multicast_supported", 132, bool),
    ("mps_enabled", 133, bool),
    ("host_numa_id", 134, int),
    ("d3d12_cig_supported", 135, bool),
    ("mem_decompress_algorithm_mask", 136, int),
    ("mem_decompress_maximum_length", 137, int),
    ("vulkan_cig_supported", 138, bool),
    ("gpu_pci_device_id", 139, int),
    ("gpu_pci_subsystem_id", 140, int),
    ("host_numa_virtual_memory_management_supported", 141, bool),
    ("host_numa_memory_pools_supported", 142, bool),
    ("host_numa_multinode_ipc_supported", 143, bool),
    ("host_memory_pools_supported", 144, bool),
    ("host_virtual_memory_management_supported", 145, bool),
    ("host_alloc_dma_buf_supported", 146, bool),
    ("only_partial_host_native_atomic_supported", 147, bool),
)


class DeviceProperties:
    """A device's attributes under cuda.core 1.2's names (``Device.properties``), each read
    with ``cuDeviceGetAttribute`` on first use and kept. An attribute the loaded driver does not
    know raises :class:`CUDAError` when read. Cannot be instantiated directly
    (``RuntimeError``).
    """

    __slots__ = ("_device_id", "_values", "__weakref__")

    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            "DeviceProperties cannot be instantiated directly. Use Device(n).properties."
        )

    @classmethod
    def _init(cls, device_id: int) -> "DeviceProperties":
        self = object.__new__(cls)
        self._device_id = device_id
        self._values = {}
        return self

    def _read(self, name: str, number: int, kind: type):
        value = self._values.get(name)
        if value is None:
            value = kind(_custody._device_attribute(self._device_id, number))
            self._values[name] = value
        return value

    def __repr__(self) -> str:
        return f"<DeviceProperties device={self._device_id}>"


def _property(name: str, number: int, kind: type) -> property:
    def read(self):
        return self._read(name, number, kind)

    read.__name__ = name
    article = "an" if kind is int else "a"
    read.__doc__ = f"``CU_DEVICE_ATTRIBUTE_{name.upper()}`` ({number}), as {article} {kind.__name__}."
    return property(read)


for _name, _number, _kind in ATTRIBUTES:
    setattr(DeviceProperties, _name, _property(_name, _number, _kind))
del _name, _number, _kind
