"""A known GPU load for a capture: idle, tensor-core matmuls, a one-thread spin kernel, idle.

The spin kernel is the case GPU utilization hides: NVML reports the GPU 100 % busy (a kernel is
resident) while one thread of one SM works. Needs PyTorch and a CUDA GPU (the device image has both).
"""

import time

import torch


def phase(name: str) -> None:
    print("phase", name, round(time.time(), 3), flush=True)


def main() -> None:
    phase("idle")
    time.sleep(20)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    phase("matmul")
    end = time.time() + 60
    while time.time() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
    phase("spin")
    end = time.time() + 320
    while time.time() < end:
        torch.cuda._sleep(int(2e9))  # one thread spinning ~1 s
        torch.cuda.synchronize()
    phase("idle2")
    time.sleep(20)
    phase("done")


if __name__ == "__main__":
    main()
