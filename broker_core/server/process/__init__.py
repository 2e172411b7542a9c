"""The broker process: started, wired from the rooms below, stopped; its background tasks,
its ZooKeeper session and the idle shutdown."""
