"""The local multi-region stack behind `make run`: starts and supervises every process."""
