"""The machine a daemon runs on: the home folder's paths, its lock, the keys file, and giving memory back."""
