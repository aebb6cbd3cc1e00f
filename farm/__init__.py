"""The job farm: whole jobs on several GPUs, of one machine or of a Ray cluster.

The unit of parallelism is the job (splitting one FramePack job across PCIe-connected cards moves more data than it
saves). Ray runs one worker actor per GPU (farm/workers.py), each holding its own models and MemoryManager (the VRAM
cap and the host-RAM budget apply per worker); the dispatcher (farm/dispatch.py) hands each job to a free worker,
streams its events back (Ray actor generators) and, when a worker dies mid-job, continues the job on another worker
from its last section checkpoint (pipeline/resume.py). farm/executor.py puts the farm behind the one runner
(jobs/runner.py): the queue's jobs run as many at once as there are workers.

Importing this package does not import Ray: the app without --ray/--gpus never loads it.
"""
