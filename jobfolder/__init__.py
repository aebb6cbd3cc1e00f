"""jobfolder/: what a job leaves on disk, and the one place that reads and writes it: the folder with its images,
section videos, final.mp4 and job.json (folder.py: `Job`; done means its files are there and match their recorded
hashes), and the latents after each section (checkpoint.py). A layer of its own below pipeline/, because every
door reads job folders without running a job: the queue and its runner, the page's past jobs, the command line,
post-processing and the farm; the orchestrator, one floor up, writes them as a job runs."""
