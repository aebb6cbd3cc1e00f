"""`python -m cli ...` and the `steadyframe-cli` command: the ROCm environment profile is applied before torch
is imported."""
import sys


def run() -> int:
    import rocm

    rocm.apply_env_profile()
    rocm.configure_host_heap()       # fixed glibc thresholds: RSS given back between sections and jobs

    if sys.argv[1:2] == ["queue"]:      # after the environment profile, on purpose
        from cli.queue import main

        return main(sys.argv[2:])
    from cli.commands import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
