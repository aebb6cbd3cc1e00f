"""video/: the video files: H.264 segments joined into mp4 files (mp4.py), the video so far kept as settled chunks
(buffer.py) and written after each section on a background thread (section_writer.py), the cross-fade (blend.py)."""
