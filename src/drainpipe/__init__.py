"""drainpipe"""
