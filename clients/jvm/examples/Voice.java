// Why: the voice path end to end with this library: a WAV is sent to the `voice` pipeline as
// 100 ms audio frames (16 kHz mono), and the spoken reply is written to a WAV. Usage:
//   java -cp kazeia-client.jar:. Voice [--socket PATH] IN.wav OUT.wav
import java.nio.file.Path;

import org.kazeia.client.Client;
import org.kazeia.client.Event;
import org.kazeia.client.KazeiaException;
import org.kazeia.client.Options;
import org.kazeia.client.Pcm;
import org.kazeia.client.Turn;
import org.kazeia.client.TurnRequest;
import org.kazeia.client.TurnResult;
import org.kazeia.client.Wav;

public final class Voice {
    public static void main(String[] args) {
        Path socket = Client.defaultSocket();
        int i = 0;
        if (args.length > 1 && args[0].equals("--socket")) {
            socket = Path.of(args[1]);
            i = 2;
        }
        if (args.length - i != 2) {
            System.err.println("usage: Voice [--socket PATH] IN.wav OUT.wav");
            System.exit(2);
        }
        Pcm in = Wav.read(Path.of(args[i])).toMono16k();
        Path out = Path.of(args[i + 1]);
        try (Client client = Client.connect(socket, new Options().clientName("kazeia-jvm-voice"))) {
            Turn turn = client.turn(TurnRequest.audio("voice", in.sampleRate(), in.channels()));
            turn.streamAudio(in);
            TurnResult r = turn.await();
            Event.Transcript heard = r.transcript();
            System.err.println("[heard: " + (heard == null ? "" : heard.text()) + "]");
            System.out.println(r.text());
            Pcm reply = r.audio();
            if (reply == null) {
                System.err.println("no audio in the reply (stop: " + r.stop() + ")");
                System.exit(1);
            }
            Wav.write(out, reply);
            System.err.printf("[reply: %.1f s at %d Hz written to %s; stop: %s]%n", reply.seconds(), reply.sampleRate(), out, r.stop());
        } catch (KazeiaException e) {
            System.err.println("error [" + e.code() + "]: " + e.messageOnly());
            System.exit(1);
        }
    }
}
