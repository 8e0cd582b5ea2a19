"""Code shared by every Meridian service. Services never import each other; they meet here
and in the gRPC contracts under proto/."""
