"""``DeviceProperties``: a device's attributes under cuda.core 1.2's names.

Each property reads one ``CU_DEVICE_ATTRIBUTE_*`` with ``cuDeviceGetAttribute`` (no context need
be current) the first time it is read, and keeps the value: attributes do not change while the
process runs. The class lists each name, in cuda.core 1.2's order, with the type it reads as
(``bool`` or ``int``) and its attribute's number in the CUDA headers. Attributes newer than the
loaded driver raise :class:`custody.CUDAError` (``CUDA_ERROR_INVALID_VALUE``) when read.
"""

from __future__ import annotations

from typing import Any

from custody import _custody

# (name, CUdevice_attribute number, type) of every property, in the class's order.
ATTRIBUTES: "list[tuple[str, int, type]]" = []


class _Attribute:
    """Where a ``DeviceProperties`` property is declared (``name: int = _attribute(number)``):
    made into the property that reads attribute ``number`` as its annotation's type."""

    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number

    def __set_name__(self, owner: type, name: str) -> None:
        kind = {"int": int, "bool": bool}[owner.__annotations__[name]]
        ATTRIBUTES.append((name, self.number, kind))
        setattr(owner, name, _property(name, self.number, kind))


def _attribute(number: int) -> Any:
    """The declaration of a property reading ``CU_DEVICE_ATTRIBUTE_*`` number ``number`` (typed
    ``Any`` so that the annotation beside it is the property's type)."""
    return _Attribute(number)


def _property(name: str, number: int, kind: type) -> property:
    def read(self):
        return self._read(name, number, kind)

    read.__name__ = name
    article = "an" if kind is int else "a"
    read.__doc__ = f"``CU_DEVICE_ATTRIBUTE_{name.upper()}`` ({number}), as {article} {kind.__name__}."
    return property(read)


class DeviceProperties:
    """A device's attributes under cuda.core 1.2's names (``Device.properties``), each read
    with ``cuDeviceGetAttribute`` on first use and kept. An attribute the loaded driver does not
    know raises :class:`CUDAError` when read. Cannot be instantiated directly
    (``RuntimeError``).
    """

    __slots__ = ("_device_id", "_values", "__weakref__")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
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

    max_threads_per_block: int = _attribute(1)
    max_block_dim_x: int = _attribute(2)
    max_block_dim_y: int = _attribute(3)
    max_block_dim_z: int = _attribute(4)
    max_grid_dim_x: int = _attribute(5)
    max_grid_dim_y: int = _attribute(6)
    max_grid_dim_z: int = _attribute(7)
    max_shared_memory_per_block: int = _attribute(8)
    total_constant_memory: int = _attribute(9)
    warp_size: int = _attribute(10)
    max_pitch: int = _attribute(11)
    maximum_texture1d_width: int = _attribute(21)
    maximum_texture1d_linear_width: int = _attribute(69)
    maximum_texture1d_mipmapped_width: int = _attribute(77)
    maximum_texture2d_width: int = _attribute(22)
    maximum_texture2d_height: int = _attribute(23)
    maximum_texture2d_linear_width: int = _attribute(70)
    maximum_texture2d_linear_height: int = _attribute(71)
    maximum_texture2d_linear_pitch: int = _attribute(72)
    maximum_texture2d_mipmapped_width: int = _attribute(73)
    maximum_texture2d_mipmapped_height: int = _attribute(74)
    maximum_texture3d_width: int = _attribute(24)
    maximum_texture3d_height: int = _attribute(25)
    maximum_texture3d_depth: int = _attribute(26)
    maximum_texture3d_width_alternate: int = _attribute(47)
    maximum_texture3d_height_alternate: int = _attribute(48)
    maximum_texture3d_depth_alternate: int = _attribute(49)
    maximum_texturecubemap_width: int = _attribute(52)
    maximum_texture1d_layered_width: int = _attribute(42)
    maximum_texture1d_layered_layers: int = _attribute(43)
    maximum_texture2d_layered_width: int = _attribute(27)
    maximum_texture2d_layered_height: int = _attribute(28)
    maximum_texture2d_layered_layers: int = _attribute(29)
    maximum_texturecubemap_layered_width: int = _attribute(53)
    maximum_texturecubemap_layered_layers: int = _attribute(54)
    maximum_surface1d_width: int = _attribute(55)
    maximum_surface2d_width: int = _attribute(56)
    maximum_surface2d_height: int = _attribute(57)
    maximum_surface3d_width: int = _attribute(58)
    maximum_surface3d_height: int = _attribute(59)
    maximum_surface3d_depth: int = _attribute(60)
    maximum_surface1d_layered_width: int = _attribute(61)
    maximum_surface1d_layered_layers: int = _attribute(62)
    maximum_surface2d_layered_width: int = _attribute(63)
    maximum_surface2d_layered_height: int = _attribute(64)
    maximum_surface2d_layered_layers: int = _attribute(65)
    maximum_surfacecubemap_width: int = _attribute(66)
    maximum_surfacecubemap_layered_width: int = _attribute(67)
    maximum_surfacecubemap_layered_layers: int = _attribute(68)
    max_registers_per_block: int = _attribute(12)
    clock_rate: int = _attribute(13)
    texture_alignment: int = _attribute(14)
    texture_pitch_alignment: int = _attribute(51)
    gpu_overlap: bool = _attribute(15)
    multiprocessor_count: int = _attribute(16)
    kernel_exec_timeout: bool = _attribute(17)
    integrated: bool = _attribute(18)
    can_map_host_memory: bool = _attribute(19)
    compute_mode: int = _attribute(20)
    concurrent_kernels: bool = _attribute(31)
    ecc_enabled: bool = _attribute(32)
    pci_bus_id: int = _attribute(33)
    pci_device_id: int = _attribute(34)
    pci_domain_id: int = _attribute(50)
    tcc_driver: bool = _attribute(35)
    memory_clock_rate: int = _attribute(36)
    global_memory_bus_width: int = _attribute(37)
    l2_cache_size: int = _attribute(38)
    max_threads_per_multiprocessor: int = _attribute(39)
    unified_addressing: bool = _attribute(41)
    compute_capability_major: int = _attribute(75)
    compute_capability_minor: int = _attribute(76)
    global_l1_cache_supported: bool = _attribute(79)
    local_l1_cache_supported: bool = _attribute(80)
    max_shared_memory_per_multiprocessor: int = _attribute(81)
    max_registers_per_multiprocessor: int = _attribute(82)
    managed_memory: bool = _attribute(83)
    multi_gpu_board: bool = _attribute(84)
    multi_gpu_board_group_id: int = _attribute(85)
    host_native_atomic_supported: bool = _attribute(86)
    single_to_double_precision_perf_ratio: int = _attribute(87)
    pageable_memory_access: bool = _attribute(88)
    concurrent_managed_access: bool = _attribute(89)
    compute_preemption_supported: bool = _attribute(90)
    can_use_host_pointer_for_registered_mem: bool = _attribute(91)
    cooperative_launch: bool = _attribute(95)
    max_shared_memory_per_block_optin: int = _attribute(97)
    pageable_memory_access_uses_host_page_tables: bool = _attribute(100)
    direct_managed_mem_access_from_host: bool = _attribute(101)
    virtual_memory_management_supported: bool = _attribute(102)
    handle_type_posix_file_descriptor_supported: bool = _attribute(103)
    handle_type_win32_handle_supported: bool = _attribute(104)
    handle_type_win32_kmt_handle_supported: bool = _attribute(105)
    max_blocks_per_multiprocessor: int = _attribute(106)
    generic_compression_supported: bool = _attribute(107)
    max_persisting_l2_cache_size: int = _attribute(108)
    max_access_policy_window_size: int = _attribute(109)
    gpu_direct_rdma_with_cuda_vmm_supported: bool = _attribute(110)
    reserved_shared_memory_per_block: int = _attribute(111)
    sparse_cuda_array_supported: bool = _attribute(112)
    read_only_host_register_supported: bool = _attribute(113)
    memory_pools_supported: bool = _attribute(115)
    gpu_direct_rdma_supported: bool = _attribute(116)
    gpu_direct_rdma_flush_writes_options: int = _attribute(117)
    gpu_direct_rdma_writes_ordering: int = _attribute(118)
    mempool_supported_handle_types: int = _attribute(119)
    deferred_mapping_cuda_array_supported: bool = _attribute(121)
    surface_alignment: int = _attribute(30)
    async_engine_count: int = _attribute(40)
    can_tex2d_gather: bool = _attribute(44)
    maximum_texture2d_gather_width: int = _attribute(45)
    maximum_texture2d_gather_height: int = _attribute(46)
    stream_priorities_supported: bool = _attribute(78)
    can_flush_remote_writes: bool = _attribute(98)
    host_register_supported: bool = _attribute(99)
    timeline_semaphore_interop_supported: bool = _attribute(114)
    cluster_launch: bool = _attribute(120)
    can_use_64_bit_stream_mem_ops: bool = _attribute(122)
    can_use_stream_wait_value_nor: bool = _attribute(123)
    dma_buf_supported: bool = _attribute(124)
    ipc_event_supported: bool = _attribute(125)
    mem_sync_domain_count: int = _attribute(126)
    tensor_map_access_supported: bool = _attribute(127)
    handle_type_fabric_supported: bool = _attribute(128)
    unified_function_pointers: bool = _attribute(129)
    numa_config: int = _attribute(130)
    numa_id: int = _attribute(131)
    multicast_supported: bool = _attribute(132)
    mps_enabled: bool = _attribute(133)
    host_numa_id: int = _attribute(134)
    d3d12_cig_supported: bool = _attribute(135)
    mem_decompress_algorithm_mask: int = _attribute(136)
    mem_decompress_maximum_length: int = _attribute(137)
    vulkan_cig_supported: bool = _attribute(138)
    gpu_pci_device_id: int = _attribute(139)
    gpu_pci_subsystem_id: int = _attribute(140)
    host_numa_virtual_memory_management_supported: bool = _attribute(141)
    host_numa_memory_pools_supported: bool = _attribute(142)
    host_numa_multinode_ipc_supported: bool = _attribute(143)
    host_memory_pools_supported: bool = _attribute(144)
    host_virtual_memory_management_supported: bool = _attribute(145)
    host_alloc_dma_buf_supported: bool = _attribute(146)
    only_partial_host_native_atomic_supported: bool = _attribute(147)
