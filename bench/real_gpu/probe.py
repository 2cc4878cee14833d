"""Direct pynvml reads (no truegpu code) to hold against what the exporter served."""

import pynvml as nv

CALLS = (
    ("gpm_support", nv.nvmlGpmQueryDeviceSupport), ("mig_mode", nv.nvmlDeviceGetMigMode),
    ("power_limit_mW", nv.nvmlDeviceGetEnforcedPowerLimit), ("power_usage_mW", nv.nvmlDeviceGetPowerUsage),
    ("total_energy_mJ", nv.nvmlDeviceGetTotalEnergyConsumption),
    ("temp_C", lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
    ("clocks_event_reasons", nv.nvmlDeviceGetCurrentClocksEventReasons),
    ("util", nv.nvmlDeviceGetUtilizationRates), ("ecc_mode", nv.nvmlDeviceGetEccMode),
    ("remapped_rows", nv.nvmlDeviceGetRemappedRows), ("pcie_gen_cur", nv.nvmlDeviceGetCurrPcieLinkGeneration),
    ("pcie_gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration), ("pcie_width_cur", nv.nvmlDeviceGetCurrPcieLinkWidth),
    ("nvlink0_state", lambda h: nv.nvmlDeviceGetNvLinkState(h, 0)),
    ("compute_procs", nv.nvmlDeviceGetComputeRunningProcesses), ("persistence", nv.nvmlDeviceGetPersistenceMode),
    ("bus_id", lambda h: nv.nvmlDeviceGetPciInfo(h).busId),
)


def main() -> None:
    nv.nvmlInit()
    print("driver", nv.nvmlSystemGetDriverVersion(), "nvml", nv.nvmlSystemGetNVMLVersion())
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        print("GPU", i, nv.nvmlDeviceGetName(h), nv.nvmlDeviceGetUUID(h))
        for name, fn in CALLS:
            try:
                print(f"  {name}: {fn(h)}")
            except nv.NVMLError as exc:
                print(f"  {name}: {type(exc).__name__}: {exc}")
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
