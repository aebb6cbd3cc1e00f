"""pipeline/: one job, from a request to its video: the request's checks, the models (real or tiny), the stages
(text encoders, VAE encode, image encoder, per section: transformer sampling and VAE decode), sections and
samplers, LoRAs, extension, and how a run starts (new, extended, resumed); the job folder it writes is
jobfolder/'s. Free of globals and of UI."""
