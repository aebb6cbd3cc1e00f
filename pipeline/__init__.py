"""pipeline/: one job, from a request to its video: the request's checks, the models (real or tiny), the stages
(text encoders, VAE encode, image encoder, per section: transformer sampling and VAE decode), sections and
samplers, LoRAs, extension, the job folder with its checkpoints, and resume. Free of globals and of UI."""
