"""Local Dynamo stack: tiny offline model, mocker workers, frontend and router processes."""
