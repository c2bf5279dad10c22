"""The bottom of the imports: what models/, envs/ and common/ all use, importing nothing of this project.
config_fields.py: ConfigError and `ranged` (a config field with its range); video.py: sample_frame_indices."""
