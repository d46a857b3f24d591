-- Version 34: placement that knows the wiring (issue 40; docs/workers.md, "Topology"). A worker reports how
-- its GPUs are wired at register (workers.gpu_topology: [{index, nvlink_peers, pcie_switch, numa_node}],
-- [] where NVML could not tell); placement gives a multi-GPU task GPUs of one NVLink set from it.
ALTER TABLE workers ADD COLUMN gpu_topology TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(gpu_topology));
