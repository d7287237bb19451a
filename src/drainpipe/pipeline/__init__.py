"""The drainpipe metrics pipeline: metric definitions, mergeable functions, stores and rendering."""
